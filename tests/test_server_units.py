"""The server's plain-Python parts, without starting SGLang: option defaults, request
checks, admission, usage, the endpoint extension point and the ASGI guard."""

from __future__ import annotations

import asyncio
import types

import pytest
from pydantic import BaseModel

from prefillonly_sgl.scoring.call_context import current
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.usage import RequestUsage
from prefillonly_sgl.scoring.validation import ModelLimits
from prefillonly_sgl.server.admission import AdmissionControl
from prefillonly_sgl.server.endpoints import (
    ENDPOINT_PROTOCOL,
    EndpointSpec,
    collect_endpoints,
    load_app_endpoints,
)
from prefillonly_sgl.server.guard import GuardPolicy, RequestGuard
from prefillonly_sgl.server.options import parse_serve_argv
from prefillonly_sgl.server.request_checks import (
    RequestTooLargeError,
    check_generate_body,
    check_score_body,
    parse_json_body,
)

LIMITS = ModelLimits(vocab_size=100, max_prompt_tokens=50)


def count_chars(first, second) -> int:  # a stand-in tokenizer: one token per character
    return len(first) + len(second)


# -- options ---------------------------------------------------------------------------------


def test_serve_argv_is_split_into_ours_and_sglangs():
    options, rest = parse_serve_argv(
        ["--app", "a.py", "--port", "8000", "--max-pending-requests", "7", "--app", "b"]
    )
    assert options.apps == ("a.py", "b") and options.max_pending_requests == 7
    assert rest == ["--port", "8000"]
    assert options.rerank_answer == "cohere"  # /v1/rerank: Cohere's object by default
    options, _ = parse_serve_argv(["--rerank-answer", "sglang"])
    assert options.rerank_answer == "sglang"
    with pytest.raises(SystemExit):  # argparse: a usage error naming the choices
        parse_serve_argv(["--rerank-answer", "jina"])


@pytest.fixture
def model_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path / "cache"))  # no saved profiles
    (tmp_path / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "torch_dtype": "float32"}'
    )
    return str(tmp_path)


def _serve_flags(argv: list[str]):
    """serve's options and SGLang's flags read by SGLang's parser, as cli.py reads them."""
    from prefillonly_sgl.sglang_runtime.server_flags import parse_flags

    options, rest = parse_serve_argv(argv)
    return options, parse_flags(rest)


def _serve_features(model: str, argv: list[str]) -> list[str]:
    from prefillonly_sgl.server.options import serve_config

    options, flags = _serve_flags(["--model-path", model, "--device", "cpu", *argv])
    return list(serve_config(options, flags).features)


def test_disable_flags_leave_their_feature_out(model_folder):
    from prefillonly_sgl.features import FEATURES

    options, rest = parse_serve_argv(["--disable-prefill-only-attention", "--port", "1"])
    assert options.disabled == ("prefill_attention",) and rest == ["--port", "1"]
    features = _serve_features(model_folder, ["--disable-prefill-only-attention"])
    # stock attention cannot run with prefill-only KV: that goes too
    assert set(features) == set(FEATURES) - {"prefill_attention", "prefill_kv"}
    assert _serve_features(model_folder, ["--disable-prefill-only-kv"]) == [
        "prefill_attention",
        "jct_scheduler",
        "hybrid_prefill",
        "prompt_logprobs",
    ]
    assert "prompt_logprobs" not in _serve_features(
        model_folder, ["--disable-prompt-logprob-cache"]
    )
    options, _ = parse_serve_argv(["--disable-hybrid-prefill", "--hybrid-prefill-chunk-size", "64"])
    assert options.feature_options == {"hybrid_prefill_chunk_size": 64}
    assert "hybrid_prefill" not in _serve_features(model_folder, ["--disable-hybrid-prefill"])
    assert "hybrid_prefill" in _serve_features(model_folder, ["--hybrid-prefill-mode", "token"])
    with pytest.raises(ValueError, match="prefill_kv needs prefill_attention"):
        _serve_features(model_folder, ["--features", "prefill_kv"])
    assert _serve_features(model_folder, ["--features", "prefill_attention"]) == [
        "prefill_attention"
    ]
    assert _serve_features(model_folder, ["--patches", ""]) == []  # the flag's earlier name


def test_schedule_policy_jct_is_ours_and_sglangs_pass_through(model_folder):
    options, rest = parse_serve_argv(["--port", "1", "--jct-aging", "0.5"])
    assert options.jct and options.feature_options == {"jct_aging": 0.5}
    assert rest == ["--port", "1"]
    assert "jct_scheduler" in _serve_features(model_folder, ["--jct-aging", "0.5"])
    options, rest = parse_serve_argv(["--schedule-policy", "lpm", "--port", "1"])
    assert not options.jct and rest == ["--port", "1"]
    assert "jct_scheduler" not in _serve_features(model_folder, ["--schedule-policy", "lpm"])
    with pytest.raises(SystemExit):  # argparse: a usage error naming the flag
        parse_serve_argv(["--hybrid-prefill-chunk-size", "0"])


def test_device_defaults_never_override_the_users_flags(tmp_path, model_folder):
    from prefillonly_sgl.server.options import serve_config, server_flags

    def flags_for(argv, metrics=True, device="cpu"):
        options, flags = _serve_flags(["--device", device, *argv])
        return server_flags(serve_config(options, flags), flags, metrics).values

    flags = flags_for(["--attention-backend", "triton", "--model", model_folder])
    assert flags["attention_backend"] == "triton"
    assert flags["model_path"] == model_folder  # --model is SGLang's alias
    assert flags["max_total_tokens"] == 16384
    assert flags["enable_metrics"] and flags["device"] == "cpu"
    assert flags["sleep_on_idle"]  # an idle CPU server must not spin a core
    assert not flags_for(["--model", model_folder], device="cuda")["sleep_on_idle"]
    assert flags_for(["--model", model_folder], device="cuda")["attention_backend"] == "flashinfer"
    config = tmp_path / "c.yaml"
    config.write_text("max-total-tokens: 1000\nenable-metrics: true\n")
    flags = flags_for(["--config", str(config), "--model", model_folder])
    assert flags["max_total_tokens"] == 1000 and flags["enable_metrics"]
    assert not flags_for(["--model", model_folder], metrics=False)["enable_metrics"]


def test_cpu_dtype_auto_is_the_folders_own_never_float16(model_folder):
    """SGLang's "auto" runs a float32 folder in float16, which has no fast CPU kernels
    (3.5x slower than float32 here): on CPU, serve and the Engine ask for the folder's."""
    from prefillonly_sgl.machine.device_defaults import resolve_dtype
    from prefillonly_sgl.server.options import serve_config, server_flags

    model = model_folder
    assert resolve_dtype(model, "cpu", "auto") == "float32"
    assert resolve_dtype(model, "cpu", "bfloat16") == "bfloat16"  # the user's choice
    assert resolve_dtype(model, "cuda", "auto") == "auto"  # float16 is fast there
    assert resolve_dtype(model + "/missing", "cpu", "auto") == "auto"

    def dtype_for(argv):
        options, flags = _serve_flags(argv)
        return server_flags(serve_config(options, flags), flags).values["dtype"]

    assert dtype_for(["--model-path", model, "--device", "cpu"]) == "float32"
    assert dtype_for(["--model", model, "--dtype", "bfloat16", "--device", "cpu"]) == "bfloat16"
    assert dtype_for(["--model", model, "--dtype", "auto", "--device", "cpu"]) == "float32"
    assert dtype_for(["--model", model, "--device", "cuda"]) == "auto"  # SGLang's own


def test_serve_builds_the_server_args_sglang_would(tmp_path, model_folder):
    """SGLang's flags are parsed once (server_flags.parse_flags) and ServerArgs built after
    our configuration (server_flags.server_args): for the same flags, the same ServerArgs
    as SGLang's own prepare_server_args, a --config file included."""
    from sglang.srt.server_args import ServerArgs, prepare_server_args, record_fields

    from prefillonly_sgl.sglang_runtime.server_flags import parse_flags, server_args

    config = tmp_path / "c.yaml"
    config.write_text("max-total-tokens: 1000\nenable-metrics: true\n")
    for argv in (
        ["--model-path", model_folder, "--device", "cpu", "--port", "1234"],
        ["--model", model_folder, "--device", "cpu", "--radix-eviction-policy", "lru"],
        ["--config", str(config), "--model", model_folder, "--device", "cpu", "--dtype", "half"],
    ):
        ours, theirs = server_args(parse_flags(argv)), prepare_server_args(argv)
        for field in record_fields(ServerArgs):
            assert getattr(ours, field.name) == getattr(theirs, field.name), field.name
        assert ours._launch_command == theirs._launch_command
    with pytest.raises(SystemExit):  # SGLang's usage error, before anything starts
        parse_flags(["--no-such-flag"])


# -- request checks --------------------------------------------------------------------------


def test_score_body_checks():
    good = {"query": "q", "items": ["a", "b"], "label_token_ids": [1, 2]}
    assert check_score_body(good, LIMITS, count_chars, max_prompts=10) == 2
    assert check_score_body({**good, "query": None, "items": [[1], [2]]}, LIMITS, count_chars, 10)
    for bad, message in [
        ({**good, "items": ["a"] * 11}, "at most 10"),
        ({**good, "label_token_ids": [[1], [2], [3]]}, "3 lists for 2 items"),
        ({**good, "label_token_ids": [[1], [2, 2]]}, "label_token_ids[1]"),
        ({**good, "item_first": "yes"}, "item_first must be"),
        ({**good, "query": "x" * 50}, "longer than the 50"),
    ]:
        with pytest.raises(InvalidRequestError, match=message.replace("[", r"\[")):
            check_score_body(bad, LIMITS, count_chars, max_prompts=10)
    with pytest.raises(RequestTooLargeError):
        check_score_body({**good, "items": ["a"] * 11}, LIMITS, count_chars, max_prompts=10)


def test_generate_body_checks():
    assert check_generate_body({"text": ["a", "b"]}, LIMITS, 10) == 2
    assert check_generate_body({"input_ids": [[1], [2, 3]]}, LIMITS, 10) == 2
    for bad, message in [
        ({"text": ""}, "text is empty"),
        ({"text": ["a", ""]}, r"text\[1\] is empty"),
        ({"input_ids": [1, 100]}, "outside the vocabulary"),
        ({"input_ids": [1] * 51}, "longer than the 50"),
        ({"text": "a", "input_ids": [1]}, "not both"),
        ({}, "text is missing"),
        ({"text": "a", "sampling_params": 3}, "sampling_params must be an object"),
        ({"text": "a", "sampling_params": {"n": 0}}, "must be a positive integer"),
        ({"text": "a", "sampling_params": {"n": 11}}, "at most 10"),
    ]:
        with pytest.raises(InvalidRequestError, match=message):
            check_generate_body(bad, LIMITS, 10)


def test_json_body_errors_name_the_problem():
    with pytest.raises(InvalidRequestError, match="byte 0xff at offset 1"):
        parse_json_body(b'"\xff"')
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        parse_json_body(b"{")
    with pytest.raises(InvalidRequestError, match="empty"):
        parse_json_body(b"  ")


# -- admission and usage ---------------------------------------------------------------------


def test_admission_bounds_requests_and_prompts():
    admission = AdmissionControl(max_requests=2, max_prompts=10)
    assert admission.admit(8) is None
    assert "prompts in progress" in admission.admit(3)
    assert admission.admit(2) is None
    assert "requests in progress" in admission.admit(1)
    admission.release(8)
    admission.release(2)
    assert (admission.requests, admission.prompts) == (0, 0)
    assert admission.admit(50) is None  # an idle server takes even an oversized request


def test_usage_aggregates_prompts_of_a_request():
    usage = RequestUsage()
    meta = dict(prompt_tokens=10, cached_tokens=4, queue_time=0.5)
    a = {"meta_info": {"id": "a", **meta, "forward_entry_time": 100.0}}
    b = {"meta_info": {"id": "b", **meta, "queue_time": 0.7, "prefill_finished_time": 102.5}}
    usage.add_output([a, b])
    usage.add_output(a)  # a streamed repeat replaces, does not add
    assert (usage.prompts, usage.prompt_tokens, usage.cached_tokens) == (2, 20, 8)
    assert usage.queue_time == 0.7 and usage.running_time == 2.5
    assert dict(usage.headers())[b"x-prefillonly-cached-tokens"] == b"8"


# -- endpoint extension point ----------------------------------------------------------------


class Ask(BaseModel):
    text: str


class Answer(BaseModel):
    yes: float


async def handler(request, context):
    return Answer(yes=1.0)


def test_endpoints_are_collected_by_protocol_and_spec():
    class Classifier:
        def __prefillonly_endpoint__(self):
            return EndpointSpec("/a", Ask, Answer, handler)

    module = types.ModuleType("app")
    module.classifier = Classifier()
    module.Classifier = Classifier  # a class is not an endpoint
    module.spec = EndpointSpec("/b", Ask, Answer, handler)
    module.same_spec = module.spec
    module.PREFILLONLY_ENDPOINTS = [EndpointSpec("/c", Ask, Answer, handler)]
    assert [s.path for s in collect_endpoints(module)] == ["/a", "/b", "/c"]
    assert hasattr(Classifier, ENDPOINT_PROTOCOL)


def test_app_files_are_loaded_and_checked(tmp_path):
    app = tmp_path / "my_app.py"
    app.write_text(
        "from pydantic import BaseModel\n"
        "from prefillonly_sgl.server.endpoints import EndpointSpec\n"
        "class In(BaseModel):\n    x: int\n"
        "async def h(r, c):\n    return {}\n"
        "A = EndpointSpec('/x', In, In, h)\nB = EndpointSpec('/x', In, In, h)\n"
    )
    with pytest.raises(ValueError, match="two endpoints on /x"):
        load_app_endpoints([str(app)])
    with pytest.raises(FileNotFoundError):
        load_app_endpoints([str(tmp_path / "missing.py")])
    with pytest.raises(TypeError, match="pydantic"):
        EndpointSpec("/y", dict, Answer, handler)
    with pytest.raises(ValueError, match="must start with"):
        EndpointSpec("y", Ask, Answer, handler)


# -- the ASGI guard with a fake app and runtime ----------------------------------------------


class FakeRuntime:
    def __init__(self):
        self.stopping = False
        self.aborted = []

    def shutting_down(self):
        return self.stopping

    def check(self, path, body):
        if "bad" in body:
            raise InvalidRequestError("bad field")
        return body.get("prompts", 1)

    def abort(self, record):
        self.aborted.append(record)


def run_guard(runtime, app, body: bytes, admission=None, disconnect_after: float | None = None):
    """Sends one POST through the guard; returns (status, headers, body, app_cancelled)."""
    sent, state = [], {"cancelled": False}
    policy = GuardPolicy({"/work"}, 1000, admission or AdmissionControl(4, 10))
    guard = RequestGuard(app, policy, runtime)
    incoming = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        if incoming:
            return incoming.pop(0)
        if disconnect_after is None:
            await asyncio.Event().wait()  # never: the client stays
        await asyncio.sleep(disconnect_after)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/work", "headers": []}
    asyncio.run(guard(scope, receive, send))
    start = next((m for m in sent if m["type"] == "http.response.start"), None)
    data = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return (start and start["status"]), dict(start["headers"]) if start else {}, data, state


async def ok_app(scope, receive, send):
    record = current().record
    record.usage.add_output({"meta_info": {"id": "r", "prompt_tokens": 3, "cached_tokens": 1}})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"{}"})


def test_guard_passes_good_requests_with_usage_headers():
    status, headers, _, _ = run_guard(FakeRuntime(), ok_app, b"{}")
    assert status == 200 and headers[b"x-prefillonly-prompt-tokens"] == b"3"


def test_guard_refuses_bad_large_overloaded_and_shutting_down():
    runtime = FakeRuntime()
    assert run_guard(runtime, ok_app, b'{"bad": 1}')[:1] == (400,)
    assert b"bad field" in run_guard(runtime, ok_app, b'{"bad": 1}')[2]
    assert run_guard(runtime, ok_app, b"x" * 2000)[0] == 413
    busy = AdmissionControl(1, 10)
    busy.admit(1)
    status, headers, body, _ = run_guard(runtime, ok_app, b"{}", admission=busy)
    assert status == 503 and headers[b"retry-after"] == b"1" and b"overloaded" in body
    runtime.stopping = True
    assert b"shutting down" in run_guard(runtime, ok_app, b"{}")[2]


def test_guard_aborts_the_work_of_a_client_that_disconnects():
    runtime, admission = FakeRuntime(), AdmissionControl(4, 10)
    cancelled = []

    async def slow_app(scope, receive, send):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    status, *_ = run_guard(runtime, slow_app, b"{}", admission=admission, disconnect_after=0.05)
    assert status is None  # nothing sent: the client is gone
    assert len(runtime.aborted) == 1 and cancelled == [True]
    assert (admission.requests, admission.prompts) == (0, 0)


def test_drain_timeout_stops_guarded_requests_then_aborts_the_rest():
    from prefillonly_sgl.server.guard import InFlightRequests
    from prefillonly_sgl.sglang_runtime.http_server.lifecycle import _abort_when_drain_times_out

    calls = []
    tm = types.SimpleNamespace(
        gracefully_exit=True,
        rid_to_state={"r1": object()},
        abort_request=lambda rid="", abort_all=False: calls.append(abort_all),
    )

    async def main():
        in_flight = InFlightRequests()
        waiter = asyncio.create_task(in_flight.wait_for_stop())
        await _abort_when_drain_times_out(tm, 0.3, in_flight)
        return await waiter

    assert "--shutdown-timeout" in asyncio.run(main())
    assert calls == [True]


def test_guard_answers_503_to_requests_stopped_at_shutdown():
    runtime, admission = FakeRuntime(), AdmissionControl(4, 10)
    policy = GuardPolicy({"/work"}, 1000, admission)

    async def slow_app(scope, receive, send):
        await asyncio.sleep(30)

    sent = []

    async def main():
        guard = RequestGuard(slow_app, policy, runtime)
        body = [{"type": "http.request", "body": b"{}", "more_body": False}]

        async def receive():
            if body:
                return body.pop()
            await asyncio.Event().wait()

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/work", "headers": []}
        task = asyncio.create_task(guard(scope, receive, send))
        await asyncio.sleep(0.05)
        policy.in_flight.stop_all("shut down")
        await task

    asyncio.run(main())
    assert sent[0]["status"] == 503 and b"shut down" in sent[1]["body"]
    assert len(runtime.aborted) == 1 and admission.requests == 0


def test_app_modules_load_by_name_and_cli_rejects_bad_options_before_starting(capsys):
    from prefillonly_sgl.cli import main

    specs = load_app_endpoints(["server_app_example"])  # tests/ is on sys.path
    assert [s.path for s in specs] == ["/classify/sentiment", "/rank/relevance"]
    assert main(["serve", "--features", "no-such-patch"]) == 2
    assert "no-such-patch" in capsys.readouterr().err
    assert main(["serve", "--app", "no_such_module_anywhere"]) == 2
    assert main(["serve", "--max-prompt-tokens", "4096"]) == 2
    assert "--max-prompt-tokens applies with --memory-budget" in capsys.readouterr().err
    assert main(["serve", "--memory-budget", "4GiB", "--max-total-tokens", "4096"]) == 2
    assert "--memory-budget or --max-total-tokens" in capsys.readouterr().err
    assert main(["serve", "--memory-budget", "lots"]) == 2
    assert "memory size must be" in capsys.readouterr().err


def test_every_error_body_has_sglangs_shape_and_one_type_per_status():
    import orjson

    from prefillonly_sgl.server.error_bodies import error_body

    for status, kind in ((400, "BadRequestError"), (413, "RequestTooLargeError"), (500, "Error")):
        body = orjson.loads(error_body(status, "why"))
        assert body == {"object": "error", "message": "why", "type": kind, "param": None,
                        "code": status}  # fmt: skip


def test_one_table_of_route_checks():
    """Each work path's check, from one table: SGLang's routes, the typed endpoints that
    count their prompts, a JSON object check for any other path."""
    from prefillonly_sgl.scoring.errors import InvalidRequestError
    from prefillonly_sgl.scoring.validation import ModelLimits
    from prefillonly_sgl.server.endpoints import EndpointSpec
    from prefillonly_sgl.server.route_checks import CheckContext, check_request, route_checks
    from prefillonly_sgl.wire.prefillonly import Usage

    spec = EndpointSpec("/apps/x", Usage, Usage, lambda body, context: body,
                        count_prompts=lambda body: len(body["items"]))  # fmt: skip
    table = route_checks([spec])
    assert {"/v1/score", "/generate", "/v1/completions", "/v1/chat/completions", "/apps/x"} <= set(
        table
    )
    context = CheckContext(
        ModelLimits(100, 50), lambda a, b: 3, max_prompts=4, labels_required=True
    )
    assert check_request(table, "/apps/x", {"items": [1, 2, 3]}, context) == 3
    assert check_request(table, "/anything", {"n": 2}, context) == 2
    with pytest.raises(InvalidRequestError, match="items is missing"):
        check_request(table, "/v1/score", {"query": "q"}, context)
    with pytest.raises(InvalidRequestError, match="JSON object"):
        check_request(table, "/apps/x", [1], context)


def test_allow_architecture_is_ours_and_repeatable():
    options, rest = parse_serve_argv(
        [
            "--allow-architecture",
            "XForCausalLM",
            "--allow-architecture",
            "YForCausalLM",
            "--tp",
            "1",
        ]
    )
    assert options.allow_architectures == ("XForCausalLM", "YForCausalLM")
    assert rest == ["--tp", "1"]
    assert parse_serve_argv([])[0].allow_architectures == ()
