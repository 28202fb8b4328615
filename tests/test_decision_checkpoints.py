"""Decision checkpoints on /v1/systemone (decisions/checkpoints.py): tiny random-weight
checkpoints of the three kinds SGLang 0.5.23 serves (a Qwen3.5 backbone with
decision_config.json, causal and noncausal; Clef's joint schema head; Kev's pointer head),
each answered by our server and by SGLang's own server (`python -m sglang.launch_server`
with its workers forked, stock_sglang_forked.py; its /v1/systemone handler) on the same
folder, on this machine: the answers must agree within 1e-4 (float32), refusals included.
The causal checkpoint's questions run behind the state computed once (the attention
plans' events are the oracle), and a second request on the same state finds it cached.
Each kind's two servers start together; the stock one answers and stops before ours is
asked. Eight servers: `slow`.
"""

from __future__ import annotations

import os

import pytest
import requests
import typesafe_sdk
from server_process import ServerProcess, serve_command, stock_sglang_command
from typesafe_sdk import Choice, Noul, Score, TypeSafeClient

from prefillonly_sgl.decisions.checkpoints import DECISIONS_REFUSAL
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import ATTENTION_LOG
from prefillonly_sgl.models.families import CPU_STATE_POOL
from prefillonly_sgl.models.tiny_decision_checkpoints import build_decision_checkpoint

pytestmark = pytest.mark.slow  # a stock and an ours server per kind

TOLERANCE = 1e-4
STATE = "The applicant has a stable job and pays every bill on time. " * 3
QUESTIONS = {
    "reliable": {"type": "noul", "instructions": "Is the applicant reliable?"},
    "kind": {
        "type": "choice",
        "instructions": "Which kind of applicant?",
        "criteria": {"good": "pays on time", "bad": None, "unknown": "no history"},
    },
    "level": {"type": "score", "instructions": "How reliable?", "criteria": ["low", "mid", "high"]},
}
OTHER_QUESTIONS = {
    "stable": {"type": "noul", "instructions": "Is the job stable?"},
    "history": {
        "type": "choice",
        "instructions": "Credit history?",
        "criteria": {"long": None, "short": None},
    },
}
BODY = {"model": "x", "state": STATE, "questions": QUESTIONS}
OTHER_BODY = {"model": "x", "state": STATE, "questions": OTHER_QUESTIONS}
# Refused by SGLang's handler on some kind or other: ours must say the same.
MANY = [f"o{i}" for i in range(30)]  # more options than a decider has codes
REFUSED = [
    {**BODY, "chat_template_kwargs": {"enable_thinking": False}},  # Clef, Kev: no kwargs
    {**BODY, "questions": {"many": {"type": "choice", "criteria": dict.fromkeys(MANY)}}},
    {**BODY, "questions": {}},
]  # fmt: skip
KINDS = ["decider", "decider_noncausal", "clef", "kev"]


def _start(model_path, log_path, stock: bool, env: dict | None = None) -> ServerProcess:
    """A server process started (not yet ready); `env` only for its spawned processes."""
    saved = dict(os.environ)
    os.environ.update(env or {})  # read by the spawned scheduler
    try:
        if stock:
            # A Qwen3.5 backbone on CPU: SGLang's default mamba cache (extra_buffer) is
            # GPU-only, and no_buffer runs without the overlapped scheduler (ours sets both
            # itself: models/families.py's linear_attention defaults). Sleeping while idle
            # keeps it off the cores while ours starts beside it.
            # Its state pool bounded as ours is on CPU (families.CPU_STATE_POOL): SGLang's
            # own sizing from the machine's memory zero-fills GBs (~15 s a start).
            extra = ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
                     "--sleep-on-idle", "--max-mamba-cache-size", str(CPU_STATE_POOL)]  # fmt: skip
            return ServerProcess(model_path, log_path, *extra, command=stock_sglang_command)
        return ServerProcess(model_path, log_path, command=serve_command)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _stop(server: ServerProcess) -> None:
    # Neither server's graceful shutdown is under test here (test_server_load.py's is):
    # seconds saved per kind.
    server.stop(graceful=False)


def _post(server, body, path="/v1/systemone"):
    response = requests.post(f"{server.url}{path}", json=body, timeout=300)
    return response.status_code, response.json()


def _exchanges(server) -> dict:
    return {
        "body": _post(server, BODY),
        "other": _post(server, OTHER_BODY),
        "refused": [_post(server, body) for body in REFUSED],
    }


@pytest.fixture(scope="module", params=KINDS)
def kind(request, tmp_path_factory):
    """(kind, our server, stock SGLang's exchanges, our attention log) for one kind; the
    two servers start together, stock's answers are taken and it stops before ours is
    asked."""
    name = request.param
    folder = build_decision_checkpoint(name, tmp_path_factory.mktemp(name) / "model")
    logs = tmp_path_factory.mktemp(f"{name}-logs")
    plans = logs / "plans.jsonl"
    # Both servers start at once (their start-ups are mostly one core's work each), then
    # stock answers and stops before ours is asked anything.
    stock = _start(folder, logs / "stock.log", stock=True)
    try:
        ours = _start(folder, logs / "ours.log", stock=False, env={ATTENTION_LOG: str(plans)})
    except BaseException:
        _stop(stock)
        raise
    try:
        try:
            stock.wait_ready()
            expected = _exchanges(stock)
        finally:
            _stop(stock)
        ours.wait_ready()
        yield name, ours, expected, plans
    finally:
        _stop(ours)


def _close(got, want, path="answer"):
    if isinstance(want, dict):
        assert set(got) == set(want), f"{path}: {sorted(got)} != {sorted(want)}"
        for key in want:
            _close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _close(a, b, f"{path}[{i}]")
    elif isinstance(want, float) and not isinstance(want, bool):
        assert abs(got - want) < TOLERANCE, f"{path}: {got} != {want}"
    else:
        assert got == want, f"{path}: {got!r} != {want!r}"


def test_answers_equal_sglangs_own_handler(kind):
    name, ours, expected, _ = kind
    for key in ("body", "other"):
        status, answer = _post(ours, BODY if key == "body" else OTHER_BODY)
        want_status, want = expected[key]
        assert want_status == 200, want
        assert status == 200, answer
        _close(answer, want)
        # The heads and the decision readout have no full-vocabulary distribution.
        assert all("x_label_mass" not in a for a in answer["answers"].values())
    # Random weights still tell the questions apart: a mixed-up order would fail.
    probabilities = expected["body"][1]["answers"]["kind"]["probabilities"]
    assert max(probabilities.values()) - min(probabilities.values()) > 1e-3, name


def test_refusals_equal_sglangs_own(kind):
    _, ours, expected, _ = kind
    for body, (want_status, want) in zip(REFUSED, expected["refused"], strict=True):
        status, answer = _post(ours, body)
        assert status == want_status, (answer, want)
        if want_status == 200:
            _close(answer, want)
        else:
            assert str(want) in str(answer) or _message(answer) == _message(want), (answer, want)


def _message(body) -> str:
    error = body.get("error", body)
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(body.get("message") or body.get("detail") or error)


def test_decisions_route_refuses_with_sglangs_pointer(kind):
    _, ours, _, _ = kind
    body = {"model": "x", "input": STATE, "questions": [{"name": "ok", "type": "predicate"}]}
    status, answer = _post(ours, body, "/v1/decisions")
    assert status == 400
    assert DECISIONS_REFUSAL in _message(answer)


def test_info_and_models_name_the_readout(kind):
    name, ours, _, _ = kind
    readout = {
        "decider": "decision_config",
        "decider_noncausal": "decision_config",
        "clef": "joint_schema_head",
        "kev": "pointer_head",
    }[name]
    info = requests.get(f"{ours.url}/server_info", timeout=30).json()
    decision = info["prefillonly"]["decision_readout"]
    assert decision["kind"] == readout
    noncausal = name == "decider_noncausal"
    assert decision["attention_mode"] == ("noncausal_full_attention" if noncausal else "causal")
    assert decision["state_cached_across_requests"] == (name in ("decider", "kev"))
    listed = requests.get(f"{ours.url}/v1/models", timeout=30).json()
    assert {card["readout"] for card in listed["data"] + listed["models"]} == {readout}


def _spans_during(plans, call) -> list[tuple[int, int]]:
    """(cached prefix, new tokens) of every prompt the full-attention layers ran during
    `call` (their attention plans: structured events)."""
    before = len(read_events(plans, "prefill_attention.plan"))
    call()
    events = read_events(plans, "prefill_attention.plan")[before:]
    return [tuple(span) for plan in events for span in plan["spans"]]


def test_the_state_is_computed_once_and_reused(kind):
    """Causal deciders and Kev: one prompt computes the state (the first extend of a
    Qwen3.5 backbone ends there, where the recurrent state is kept), every question's
    prompt continues from it, and the next request on the same state finds it cached."""
    name, ours, _, plans = kind
    if name not in ("decider", "kev"):
        pytest.skip(f"{name}: the state is not shared (decisions/checkpoints.shares_the_state)")
    state = "Fresh: " + STATE  # nothing of it cached yet
    first = _spans_during(plans, lambda: _post(ours, {**BODY, "state": state}))
    cold = [span for span in first if span[0] == 0]
    assert len(cold) == 1, first
    r = cold[0][1]
    behind = [prefix for prefix, _ in first if prefix]
    assert behind == [r] * len(QUESTIONS), first
    second = _spans_during(plans, lambda: _post(ours, {**OTHER_BODY, "state": state}))
    assert [prefix for prefix, _ in second] == [r] * len(OTHER_QUESTIONS), second


def test_the_typesafe_client(kind):
    _, ours, expected, _ = kind
    with TypeSafeClient(api_key="none", base_url=ours.url, model="default") as ts:
        result = ts.system_one(
            state=STATE,
            questions={
                "reliable": Noul(instructions="Is the applicant reliable?"),
                "kind": Choice(
                    instructions="Which kind of applicant?",
                    criteria={"good": "pays on time", "bad": None, "unknown": "no history"},
                ),
                "level": Score(instructions="How reliable?", criteria=["low", "mid", "high"]),
            },
        )
    assert isinstance(result, typesafe_sdk.SystemOneResponse)
    want = expected["body"][1]["answers"]
    assert abs(result.nouls["reliable"].noul - want["reliable"]["noul"]) < TOLERANCE
    assert result.choices["kind"].choice == want["kind"]["choice"]
    assert abs(result.scores["level"].score - want["level"]["score"]) < TOLERANCE
