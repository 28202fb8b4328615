"""One call's context (issue 84; scoring/call_context.py) and the one module that writes
it into SGLang's requests (sglang_runtime/request_recording.py): plain tests, SGLang's
request objects stood in by plain ones with the same fields (a GenerateReqInput's
cache_salt / lora_path, an EmbeddingReqInput without cache_salt)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from prefillonly_sgl.scoring.adapters import lora_request
from prefillonly_sgl.scoring.cache_salts import SALT_PARAM, effective_salt, salt_request
from prefillonly_sgl.scoring.call_context import (
    CallContext,
    cache_salt,
    carrying,
    current,
    salt_fields,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.usage import RequestRecord


def test_a_door_checks_its_salt_and_adapter_once_and_keeps_the_enclosing_ones():
    outer = CallContext(tenant="t", salt="s", adapter="a")
    assert outer.entering() == outer
    assert outer.entering(salt="x").salt == "x" and outer.entering(salt="x").adapter == "a"
    assert outer.entering(adapter="b").adapter == "b"
    assert outer.entering(salt="").salt == "s"  # "" is no salt: the enclosing one stays
    with pytest.raises(InvalidRequestError, match="cache_salt must be a string"):
        outer.entering(salt=3)
    with pytest.raises(InvalidRequestError, match="lora_path must be an adapter's name"):
        outer.entering(adapter=["x"])
    assert outer.sglang_salt == effective_salt("t", "s") != "s"  # the tenant's namespace


def test_each_call_into_sglang_records_into_a_child_of_the_enclosing_record():
    request = CallContext(record=RequestRecord("/v1/score"))
    call = request.for_sglang("score")
    assert call.record.parent is request.record and call.record.path == "score"
    assert [r.path for r in call.record.lineage()] == ["score", "/v1/score"]
    alone = CallContext().for_sglang("score")  # an Engine call outside any request
    assert alone.record.parent is None


def test_the_carrier_is_scoped_and_asyncio_tasks_copy_it():
    assert current() == CallContext()  # outside every call
    seen = []

    async def task():
        seen.append(current().salt)

    async def main():
        with carrying(CallContext(salt="inner")):
            job = asyncio.ensure_future(task())  # copies the context here
        seen.append(current().salt)
        await job

    asyncio.run(main())
    assert seen == [None, "inner"]
    with cache_salt("job-1"):
        assert current().salt == "job-1" and salt_fields() == {"cache_salt": "job-1"}
        with cache_salt(None):  # None keeps the enclosing salt
            assert current().salt == "job-1"
    assert salt_fields() == {} and current().salt is None
    with pytest.raises(ValueError, match="longer than"), cache_salt("x" * 5000):
        pass


def test_sglang_requests_get_the_calls_salt_and_adapter_where_they_name_none():
    generate = SimpleNamespace(cache_salt=None, lora_path=None)
    salt_request(generate, "t", "s")
    lora_request(generate, "a")
    assert generate.cache_salt == effective_salt("t", "s") and generate.lora_path == "a"
    own = SimpleNamespace(cache_salt=["mine", None], lora_path="theirs")
    salt_request(own, None, "call")
    lora_request(own, "a")
    assert own.cache_salt == ["mine", "call"] and own.lora_path == "theirs"
    embedding = SimpleNamespace(sampling_params={"max_new_tokens": 0})  # no cache_salt field
    salt_request(embedding, "t", None)
    assert embedding.sampling_params["custom_params"][SALT_PARAM] == effective_salt("t", None)
    untouched = SimpleNamespace(cache_salt=None, lora_path=None)
    salt_request(untouched, None, None)
    lora_request(untouched, None)
    assert untouched.cache_salt is None and untouched.lora_path is None


def test_the_recording_wrapper_writes_the_carried_context_into_each_request():
    """request_recording.record_generate_requests: every request that reaches SGLang's
    generate_request gets the carried call's salt and adapter, and its usage lands in the
    call's record and the request's above it."""
    from prefillonly_sgl.sglang_runtime.request_recording import record_generate_requests

    sent = []

    async def stream(obj, request=None):
        sent.append(obj)
        yield {"meta_info": {"id": "r1", "prompt_tokens": 5, "cached_tokens": 2}}

    async def handle_batch_output(recv_obj):
        return None

    tm = SimpleNamespace(generate_request=stream, _handle_batch_output=handle_batch_output)
    record_generate_requests(tm)
    request = CallContext(tenant="t", salt="s", adapter="a", record=RequestRecord("/x"))
    call = request.for_sglang("score")

    async def run():
        with carrying(call):
            return [out async for out in tm.generate_request(SimpleNamespace(
                cache_salt=None, lora_path=None, rid="r1"))]  # fmt: skip

    outs = asyncio.run(run())
    (obj,) = sent
    assert obj.cache_salt == effective_salt("t", "s") and obj.lora_path == "a"
    assert len(outs) == 1 and call.record.usage.cached_tokens == 2
    assert request.record.usage.cached_tokens == 2  # the parent sees it too
    assert call.record.sglang_requests == [obj] and request.record.sglang_requests == [obj]
