"""Per-request usage from SGLang's per-prompt meta_info, for the server and the Engine.

Every way into SGLang's scheduler (score, generate, completions) goes through the
TokenizerManager's generate_request, whose outputs carry each prompt's meta_info
(prompt_tokens, cached_tokens, timings). We wrap it per TokenizerManager instance; while
a caller has a RequestRecord in CURRENT_REQUEST (the server's guard per HTTP request,
ScoringFront per score call; asyncio tasks copy the context, so SGLang's own tasks see
it), the rids and meta_info land in that record and its parents. Without a record the
wrapper only salts.

The same wrapper gives every request its prefix-cache salt (scoring/cache_salts.py: the tenant's
and the caller's), which is why it is the one way in: a salt set anywhere else would miss
some route.
"""

from __future__ import annotations

from prefillonly_sgl.scoring.cache_salts import salt_request
from prefillonly_sgl.scoring.usage import CURRENT_REQUEST, RequestRecord

_WRAPPED = "_prefillonly_records_requests"


def record_generate_requests(tm) -> None:
    """Wraps `tm.generate_request` (once per TokenizerManager)."""
    if getattr(tm, _WRAPPED, False):
        return
    original = tm.generate_request

    async def recorded(stream, records: list[RequestRecord]):
        try:
            async for out in stream:
                for record in records:
                    record.usage.add_output(out)
                yield out
        finally:
            await stream.aclose()

    def generate_request(obj, request=None):
        salt_request(obj)  # before SGLang normalises the batch's salts
        record = CURRENT_REQUEST.get()
        if record is None:
            return original(obj, request)
        records = record.lineage()
        for one in records:
            one.sglang_requests.append(obj)
        return recorded(original(obj, request), records)

    tm.generate_request = generate_request
    setattr(tm, _WRAPPED, True)
