"""The families with recurrent layers (models/families.py's _recurrent_kind: one set of
rules for every such layer): Qwen3.5 (Gated DeltaNet linear attention, 3 linear : 1 full),
LFM2 (gated short convolutions among attention layers) and Granite 4.0 hybrid (Mamba2
mixers among attention layers, routed experts), through the Engine on CPU,
float32, every default feature on: scores against transformers (1e-4), cold and behind a
cached profile; the profile's recurrent state kept as one snapshot at its end, so items
behind it compute only their own tokens (the attention layers' plan log); labels of
several tokens and continuation logprobs through the same cache; greedy decode through
the layers' one-token kernels. The Qwen3.5 MoE text model, the published
ConditionalGeneration folder (text input) and Qwen3-Next (the same linear attention,
SGLang's other model module) score the same way; the MoE one's config as transformers'
config class writes it, layer_types without full_attention_interval."""

from __future__ import annotations

import json
import os

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine
from prefillonly_sgl.features.prefill_kv.policy import reusable_prefix_len
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import ATTENTION_LOG as LOG_ENV
from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4  # float32 engine vs float32 transformers; measured <= 5.2e-6

PROFILE = "User profile: likes science fiction, history books and long walks. " * 3 + "\n"
ITEMS = [
    "Item: a documentary about the history of the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction, " * 8 + "Relevant?",
]
OTHER_ITEMS = ["Item: a telescope. Relevant?", "Item: " + "history, " * 30 + "Relevant?"]


def _labels(reference):
    return [reference.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]


RECURRENT_FAMILIES = ["qwen3_5", "lfm2", "granite_hybrid"]


@pytest.fixture(scope="module", params=RECURRENT_FAMILIES)
def recurrent(request, tmp_path_factory):
    """(engine, reference, labels, attention plan log) of one recurrent family."""
    name = request.param
    path = build_family(name, tmp_path_factory.mktemp(name) / "model")
    log_path = tmp_path_factory.mktemp(f"{name}-log") / "plan.log"
    os.environ[LOG_ENV] = str(log_path)  # read by the spawned scheduler at each batch
    try:
        engine = Engine(path, device="cpu", dtype="float32", max_total_tokens=4096)
    finally:
        del os.environ[LOG_ENV]
    reference = TransformersReference(path)
    yield engine, reference, _labels(reference), log_path
    engine.shutdown()


def _plans_during(log_path, call) -> list[tuple[int, int]]:
    """(cached prefix, new tokens) of every request the full-attention layers ran during
    `call` (their attention plans: structured events)."""
    before = len(read_events(log_path, "prefill_attention.plan"))
    call()
    plans = read_events(log_path, "prefill_attention.plan")[before:]
    return [tuple(span) for plan in plans for span in plan["spans"]]


def test_family_features_and_start_info(recurrent):
    engine, _, _, _ = recurrent
    info = engine.get_server_info()["prefillonly"]
    assert info["model_family"] in RECURRENT_FAMILIES
    # prefill-only KV stays on: the attention layers run our backend inside SGLang's
    # HybridLinearAttnBackend; hybrid prefilling runs in token mode, and echo logprobs
    # without the prompt-logprob cache (which continues inside a cached prompt)
    assert "prefill_kv" in engine.features and "hybrid_prefill" in engine.features
    assert "prompt_logprobs" not in engine.features
    assert set(info["features_off"]) == {"hybrid_prefill:layer", "prompt_logprobs"}


def test_cold_profile_is_one_snapshot_that_items_continue_from(recurrent):
    engine, reference, labels, log_path = recurrent
    r = reusable_prefix_len(
        reference.tokenizer.encode(PROFILE), reference.prompt_ids(PROFILE, ITEMS[0])
    )
    result = []
    spans = _plans_during(log_path, lambda: result.append(engine.score(PROFILE, ITEMS, labels)))
    got = result[0]
    assert max_abs_diff(got.scores, reference.score(PROFILE, ITEMS, labels)) < TOLERANCE
    # The first prompt's first extend ends at the profile's end (the state there is what
    # the cache keeps); every other extend starts from it and computes only its item.
    assert (0, r) in spans, spans
    assert all(prefix == r for prefix, _ in spans if prefix), spans
    assert sum(new for _, new in spans) == got.prompt_tokens - 2 * r  # the profile once
    assert got.cached_tokens == 2 * r  # the two followers hit the snapshot
    # Random weights still give clearly different rows: a mixed-up item order would fail.
    assert max_abs_diff([got.scores[0]], [got.scores[1]]) > 1e-3


def test_items_behind_the_cached_profile_compute_only_their_tokens(recurrent):
    engine, reference, labels, log_path = recurrent
    engine.score(PROFILE, ITEMS[:1], labels)  # cached (or already from the test above)
    r = reusable_prefix_len(
        reference.tokenizer.encode(PROFILE), reference.prompt_ids(PROFILE, OTHER_ITEMS[0])
    )
    result = []
    spans = _plans_during(
        log_path, lambda: result.append(engine.score(PROFILE, OTHER_ITEMS, labels))
    )
    assert max_abs_diff(result[0].scores, reference.score(PROFILE, OTHER_ITEMS, labels)) < (
        TOLERANCE
    )
    assert sorted(prefix for prefix, _ in spans) == [r, r], spans
    assert result[0].cached_tokens == 2 * r


def test_prompts_without_a_reusable_prefix_keep_their_final_state(recurrent):
    """No query: nothing is reusable, so a prompt keeps every token and its final state
    (never that state under a shorter prefix); a longer prompt continues from it."""
    engine, reference, labels, _ = recurrent
    first = ["Review: terrible side effects, I would not take it again."]
    longer = [first[0] + " Sentiment:"]
    for items in (first, longer):
        got = engine.score("", items, labels)
        assert max_abs_diff(got.scores, reference.score("", items, labels)) < TOLERANCE
    assert got.cached_tokens == len(reference.prompt_ids("", first[0]))


def test_labels_of_several_tokens_and_continuations(recurrent):
    engine, reference, _, _ = recurrent
    tok = reference.tokenizer
    labels = [tok.encode(w, add_special_tokens=False) for w in (" Yes please", " No")]
    assert len(labels[0]) > 1
    got = engine.score(PROFILE, ITEMS[:2], labels).scores
    assert max_abs_diff(got, reference.score_sequences(PROFILE, ITEMS[:2], labels)) < TOLERANCE
    continuation = " a good match"
    got = engine.continuation_logprobs(PROFILE, ITEMS[:2], continuation).token_logprobs
    want = reference.continuation_logprobs(PROFILE, ITEMS[:2], continuation)
    assert max_abs_diff(got, want) < TOLERANCE
    # transformers in the Engine's own order (the prompt split where the profile ends,
    # the state handed over there): what verify holds these families to, since float32
    # makes the two orders differ on some checkpoints (docs/models.md).
    split = reference.continuation_logprobs(PROFILE, ITEMS[:2], continuation, split_at_query=True)
    assert max_abs_diff(got, split) < TOLERANCE


@pytest.mark.parametrize(
    "family, registry_row",
    [("qwen3_5_moe", "qwen3_5_moe"), ("qwen3_5_vl", "qwen3_5"), ("qwen3_next", "qwen3_next")],
)
def test_moe_published_folder_and_qwen3_next_score_cold_and_cached(
    family, registry_row, tmp_path_factory
):
    path = build_family(family, tmp_path_factory.mktemp(family) / "model")
    if family == "qwen3_5_moe":  # written by transformers' config class alone
        config = json.loads((path / "config.json").read_text())
        assert "full_attention_interval" not in config and "layer_types" in config
    reference = TransformersReference(path)
    labels = _labels(reference)
    want = reference.score(PROFILE, ITEMS, labels)
    with Engine(path, device="cpu", dtype="float32", max_total_tokens=4096) as engine:
        assert engine.get_server_info()["prefillonly"]["model_family"] == registry_row
        for _ in range(2):  # cold (one snapshot, two hits), then every item a hit
            got = engine.score(PROFILE, ITEMS, labels)
            assert max_abs_diff(got.scores, want) < TOLERANCE
            assert got.cached_tokens > 0


def test_greedy_decode_matches_transformers(recurrent):
    """Decode (generate requests only; SGLang's generate on the engine it wraps) runs the
    recurrent layers' one-token kernels (the convolution's step, and the delta rule's, on
    the pool's states): 12 greedy tokens equal transformers'."""
    import torch

    engine, reference, _, _ = recurrent
    ids = reference.tokenizer.encode(PROFILE + "Item:")
    with torch.no_grad():
        want = reference.model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[
            0, len(ids) :
        ].tolist()
    got = engine._sgl.generate(
        input_ids=ids, sampling_params={"max_new_tokens": 12, "temperature": 0}
    )
    assert got["output_ids"] == want
