"""Per-request usage from SGLang's per-prompt meta_info, for the server and the Engine.

Every way into SGLang's scheduler (score, generate, completions) goes through the
TokenizerManager's generate_request, whose outputs carry each prompt's meta_info
(prompt_tokens, cached_tokens, timings; an embedding output's cached_tokens are copied in
from its batch output by the _handle_batch_output wrapper). We wrap it per TokenizerManager
instance. This is the one module that writes a call's context (scoring/call_context.py,
carried to here through SGLang's own stack: asyncio tasks copy it) into SGLang's
requests: its prefix-cache salt (scoring/cache_salts.py: the tenant's and the caller's),
its LoRA adapter where the request names none (scoring/adapters.py), and, while the call
has a usage record (the server's guard per HTTP request, ScoringFront per call into
SGLang), the rids and meta_info land in that record and its parents. A salt or an
adapter set anywhere else would miss some route.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.adapters import lora_request
from prefillonly_sgl.scoring.cache_salts import salt_request
from prefillonly_sgl.scoring.call_context import current
from prefillonly_sgl.scoring.usage import RequestRecord

_WRAPPED = "_prefillonly_records_requests"
# SGLang 0.5.23 leaves cached_tokens out of an embedding output's meta_info (a
# classification head's score prompts are embedding requests) although its
# BatchEmbeddingOutput carries them: they wait here, by rid, until the output is recorded.
_EMBEDDING_CACHED = "_prefillonly_embedding_cached_tokens"
_MAX_WAITING = 65536  # outputs nobody records (no usage record) would otherwise pile up


def record_generate_requests(tm) -> None:
    """Wraps `tm.generate_request` (once per TokenizerManager)."""
    if getattr(tm, _WRAPPED, False):
        return
    original = tm.generate_request

    waiting: dict[str, int] = {}
    setattr(tm, _EMBEDDING_CACHED, waiting)

    async def recorded(stream, records: list[RequestRecord]):
        try:
            async for out in stream:
                _add_embedding_cached_tokens(out, waiting)
                for record in records:
                    record.usage.add_output(out)
                yield out
        finally:
            await stream.aclose()

    def generate_request(obj, request=None):
        ctx = current()
        salt_request(obj, ctx.tenant, ctx.salt)  # before SGLang normalises the batch's salts
        lora_request(obj, ctx.adapter)  # the call's adapter, where the request names none
        record = ctx.record
        if record is None:
            return original(obj, request)
        records = record.lineage()
        for one in records:
            one.sglang_requests.append(obj)
        return recorded(original(obj, request), records)

    tm.generate_request = generate_request
    handle_batch_output = tm._handle_batch_output

    async def handle_output(recv_obj):
        cached = getattr(recv_obj, "cached_tokens", None)
        if cached is not None and hasattr(recv_obj, "embeddings"):  # a BatchEmbeddingOutput
            if len(waiting) > _MAX_WAITING:
                waiting.clear()
            waiting.update(zip(recv_obj.rids, cached, strict=True))
        return await handle_batch_output(recv_obj)

    tm._handle_batch_output = handle_output
    setattr(tm, _WRAPPED, True)


def _add_embedding_cached_tokens(out, waiting: dict[str, int]) -> None:
    """An embedding output's meta_info gets the cached_tokens its batch output carried."""
    for one in out if isinstance(out, list) else [out]:
        meta = one.get("meta_info") if isinstance(one, dict) else None
        if isinstance(meta, dict) and "cached_tokens" not in meta:
            n = waiting.pop(str(meta.get("id")), None)
            if n is not None:
                meta["cached_tokens"] = n
