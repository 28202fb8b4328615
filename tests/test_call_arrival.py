"""A score call's prompts admitted together (features/jct_scheduler/call_arrival.py) and
the tag that carries a prompt's call across processes (prefill_kv/messages.py)."""

from __future__ import annotations

from prefillonly_sgl.features.jct_scheduler.call_arrival import GATHER_S, CallArrivals
from prefillonly_sgl.features.prefill_kv.messages import call_in, with_call


def _step(arrivals: CallArrivals, waiting: dict[str, tuple[str, int]], now: float) -> set[str]:
    arrivals.start_step()
    for rid, (call, size) in waiting.items():
        arrivals.observe(rid, call, size, now)
    return arrivals.held(now)


def test_a_call_is_held_while_its_prompts_keep_arriving():
    arrivals = CallArrivals()
    assert _step(arrivals, {"a0": ("a", 3)}, 0.0) == {"a0"}
    assert _step(arrivals, {"a0": ("a", 3), "a1": ("a", 3)}, 0.01) == {"a0", "a1"}
    # the last one arrives: the whole call goes at once
    assert _step(arrivals, {"a0": ("a", 3), "a1": ("a", 3), "a2": ("a", 3)}, 0.02) == set()


def test_a_prompt_that_never_comes_holds_the_call_only_briefly():
    arrivals = CallArrivals()
    assert _step(arrivals, {"a0": ("a", 2)}, 0.0) == {"a0"}
    assert _step(arrivals, {"a0": ("a", 2)}, GATHER_S / 2) == {"a0"}
    assert _step(arrivals, {"a0": ("a", 2)}, GATHER_S * 1.5) == set()


def test_other_calls_and_untagged_requests_are_not_held():
    arrivals = CallArrivals()
    held = _step(arrivals, {"a0": ("a", 2), "b0": ("b", 1)}, 0.0)
    assert held == {"a0"}  # b is complete; a waits for its second prompt
    # admitted prompts leave the queue; a finished call is forgotten
    assert _step(arrivals, {"a1": ("a", 2)}, 0.01) == set()
    assert _step(arrivals, {}, 0.02) == set() and not arrivals._calls


def test_the_tag_crosses_as_json_and_a_clients_value_reads_as_absent():
    params = with_call({"x": 1}, "abc", 4)
    assert params == {"x": 1, "prefillonly_call": ["abc", 4]}
    assert call_in(params) == ("abc", 4)
    for bad in (None, {}, {"prefillonly_call": "abc"}, {"prefillonly_call": [1, 2]},
                {"prefillonly_call": ["a", "x"]}, {"prefillonly_call": ["a", 0]}):  # fmt: skip
        assert call_in(bad) is None
