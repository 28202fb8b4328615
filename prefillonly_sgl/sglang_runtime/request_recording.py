"""Per-request usage from SGLang's per-prompt meta_info, for the server and the Engine.

Every way into SGLang's scheduler (score, generate, completions) goes through the
TokenizerManager's generate_request, whose outputs carry each prompt's meta_info
(prompt_tokens, cached_tokens, timings; an embedding output's cached_tokens are copied in
from its batch output by the _handle_batch_output wrapper). We wrap it per TokenizerManager
instance; while
a caller has a RequestRecord in CURRENT_REQUEST (the server's guard per HTTP request,
ScoringFront per score call; asyncio tasks copy the context, so SGLang's own tasks see
it), the rids and meta_info land in that record and its parents. Without a record the
wrapper only salts.

The same wrapper gives every request its prefix-cache salt (scoring/cache_salts.py: the tenant's
and the caller's), which is why it is the one way in: a salt set anywhere else would miss
some route.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.adapters import lora_request
from prefillonly_sgl.scoring.cache_salts import salt_request
from prefillonly_sgl.scoring.usage import CURRENT_REQUEST, RequestRecord

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
        salt_request(obj)  # before SGLang normalises the batch's salts
        lora_request(obj)  # the call's adapter (scoring/adapters.py), where none is named
        record = CURRENT_REQUEST.get()
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
