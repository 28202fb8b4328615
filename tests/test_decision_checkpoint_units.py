"""decisions/checkpoints.py without SGLang: the readout a checkpoint's files name, and
where its questions' prompts share the state."""

from __future__ import annotations

from prefillonly_sgl.decisions.checkpoints import LM_HEAD, readout_of, shared_prefix_len

DECIDER = {"format_version": 1, "codes": ["A", "B"], "token_ids": [5, 6], "temperature": 1.7}


def test_the_readout_follows_the_files_sglang_found():
    assert readout_of(None, None, None) == LM_HEAD and not LM_HEAD.is_checkpoint
    decider = readout_of(DECIDER, None, None)
    assert (decider.kind, decider.temperature, decider.codes) == (
        "decision_config",
        1.7,
        ("A", "B"),
    )
    assert decider.shares_the_state and decider.info()["state_cached_across_requests"]
    noncausal = readout_of({**DECIDER, "attention_mode": "noncausal_full_attention"}, None, None)
    assert not noncausal.shares_the_state  # full attention reads the whole prompt
    assert not noncausal.info()["state_computed_once"]
    clef = readout_of(None, {"width": 32}, None)
    assert clef.kind == "joint_schema_head" and clef.info()["state_computed_once"]
    assert not clef.shares_the_state  # one prompt: nothing to share across requests
    kev = readout_of(None, None, {"temperature": 0.8, "head": {}})
    assert (kev.kind, kev.temperature) == ("pointer_head", 0.8)
    assert kev.shares_the_state  # each question's prompt continues from the cached state
    assert kev.info()["route"] == "/v1/systemone"


def test_shared_prefix_leaves_each_prompt_a_token():
    assert shared_prefix_len([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix_len([[1, 2, 3], [1, 2, 3, 4]]) == 2  # the shorter keeps its last
    assert shared_prefix_len([[1, 2, 3]]) == 0  # one prompt: nothing shared in the request
    assert shared_prefix_len([[7, 1], [8, 1]]) == 0


def test_a_layout_behind_a_cached_prefix_moves_every_position():
    from sglang.srt.layers.joint_schema_head import (
        LayoutQuestion,
        pack_decision_layout,
        parse_decision_layout,
    )

    from prefillonly_sgl.decisions.checkpoints import layout_behind_prefix

    # Kev's shape: the state (40 tokens), a question, two options, the decide token.
    layout = pack_decision_layout(60, [LayoutQuestion(1, (59, 60), ((45, 50), (50, 58)))])
    moved = layout_behind_prefix(layout, 40)
    assert parse_decision_layout(moved, 20) == [LayoutQuestion(1, (19, 20), ((5, 10), (10, 18)))]
    assert layout_behind_prefix(layout, 0) == layout
    assert layout_behind_prefix(layout, 46) is None  # an option span inside the cache
