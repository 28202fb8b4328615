"""Which runtime features apply, from the Engine's switches and serve's flags: one set of
rules (prefillonly_sgl/features/__init__.py), without SGLang."""

from __future__ import annotations

import pytest

from prefillonly_sgl.features import FEATURES, STOCK_SGLANG, choose_features, select_features


def engine_features(attention=None, kv=None, jct=True, hybrid=None, logprobs=None):
    switches = {"prefill_only_attention": attention, "prefill_only_kv": kv,
                "schedule_policy": "jct" if jct else "fcfs", "hybrid_prefill": hybrid,
                "prompt_logprob_cache": logprobs}  # fmt: skip
    return choose_features(None, switches)


def test_defaults_are_every_feature_in_order():
    assert select_features() == list(FEATURES) == engine_features(True, None)


def test_switching_off_a_dependency_takes_its_default_dependents_along():
    others = ["jct_scheduler", "hybrid_prefill", "prompt_logprobs"]
    assert engine_features(False, None) == others
    assert select_features(None, ["prefill_attention"]) == others
    assert engine_features(True, False) == ["prefill_attention", *others]
    assert engine_features(True, None, jct=False, hybrid=False, logprobs=False) == [
        "prefill_attention",
        "prefill_kv",
    ]


def test_an_explicit_feature_without_its_dependency_is_an_error_in_the_callers_words():
    with pytest.raises(ValueError, match="prefill_only_kv needs prefill_only_attention"):
        engine_features(False, True)
    with pytest.raises(ValueError, match="prefill_kv needs prefill_attention"):
        select_features(["prefill_kv"])
    assert select_features(["prefill_attention"]) == ["prefill_attention"]
    assert select_features([]) == []


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="unknown runtime features"):
        select_features(["warp_drive"])
    with pytest.raises(ValueError, match="unknown"):
        select_features(None, ["warp_drive"])


def test_stock_sglang_is_every_switch_off_and_switch_values_are_checked():
    assert choose_features(None, STOCK_SGLANG) == []
    assert choose_features(None, {}) == list(FEATURES)
    with pytest.raises(ValueError, match="prefill_only_attention must be True, False or None"):
        choose_features(None, {"prefill_only_attention": "yes"})
    with pytest.raises(ValueError, match="schedule_policy must be a policy name"):
        choose_features(None, {"schedule_policy": 3})
