"""The model families that start today, each a tiny random-weight checkpoint in its
published shape (prefillonly_sgl/models/tiny_family_checkpoints.py), through the Engine
with every feature the family allows, against transformers within 1e-4 in float32: cold,
cached (the prefix cache must hit), a prompt past Gemma 3's sliding window and through
16-token hybrid chunks, labels of several tokens, echo and continuation logprobs, a
decision (the probes of `prefillonly verify`, verification/verify.py). One engine per
family, started once; Llama and Qwen2 are tests/test_engine_tiny_models.py's. Every
family here runs hybrid prefilling's whole layers in 16-token query chunks (issue 62):
batches whose length the chunk does and does not divide, several requests in one batch
and a cache hit, against transformers, with
the scheduler's log saying the layers ran in query chunks.

Also: what the family switched off is reported (get_server_info, warnings at start), a
feature asked for explicitly that the family cannot run is refused before anything starts,
and `prefillonly verify` itself on a running engine."""

from __future__ import annotations

import json
import os
import warnings

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import HYBRID_LOG
from prefillonly_sgl.models import families
from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.verification import verify
from prefillonly_sgl.verification.reference import TransformersReference

pytestmark = pytest.mark.slow

# gpt-oss and Qwen3.5 are their helpers' (issue 53); they join when they start.
STARTING_FAMILIES = [
    "qwen3", "qwen3_moe", "mistral", "phi3", "granite", "olmo2", "olmo3", "exaone4", "glm4",
    "gemma3",
]  # fmt: skip
TOLERANCE = 1e-4
# verify's "all features" variant: a small hybrid chunk, so the long probe is chunked.
ENGINE_SETTINGS = {"hybrid_prefill_chunk_size": verify.SMALL_CHUNK}


@pytest.fixture(scope="module")
def family_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {name: build_family(name, root / name) for name in STARTING_FAMILIES}


@pytest.fixture(scope="module", params=STARTING_FAMILIES)
def family(request, family_paths, tmp_path_factory):
    """(name, folder, engine, the warnings its start gave, its hybrid prefilling log)."""
    name = request.param
    path = family_paths[name]
    log = tmp_path_factory.mktemp(f"{name}-hybrid") / "hybrid.log"
    os.environ[HYBRID_LOG] = str(log)  # read by the spawned scheduler
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            engine = Engine(
                path, device="cpu", dtype="float32", max_total_tokens=8192, **ENGINE_SETTINGS
            )
    finally:
        del os.environ[HYBRID_LOG]
    try:
        yield name, path, engine, [str(w.message) for w in caught], log
    finally:
        engine.shutdown()


def test_family_matches_transformers(family):
    name, path, engine, _, _ = family
    reference = TransformersReference(path)
    config = json.loads((path / "config.json").read_text())
    probes = verify.make_probes(reference.tokenizer, config)
    window = verify.sliding_window_of(config)
    assert probes.long_tokens > max(window or 0, 2 * verify.SMALL_CHUNK)
    assert any(len(label) > 1 for label in probes.sequences)
    expected = verify.reference_answers(reference, probes)
    checks, _ = verify.run_probes(engine, probes, expected, TOLERANCE, None)
    failed = {probe: check for probe, check in checks.items() if not check.ok}
    assert not failed, f"{name}: {failed}"
    # The cached probe asserted a prefix-cache hit; here the Engine's own count of it.
    again = engine.score(probes.query, probes.items, probes.labels)
    assert again.cached_tokens > 0


def test_family_reports_what_it_switched_off(family):
    name, _, engine, start_warnings, _ = family
    family_row = families.FAMILIES[name]
    assert engine.model_family == name
    info = engine.get_server_info()["prefillonly"]
    assert info["model_family"] == name
    assert info["features"] == list(engine.features)
    assert info["features_off"] == dict(engine.config.features_off)
    assert set(info["features_off"]) == set(family_row.features_off())
    # One warning at start per feature switched off, naming the family and the docs.
    ours = [w for w in start_warnings if "docs/models.md" in w]
    assert len(ours) == len(info["features_off"])
    assert all(family_row.title in w for w in ours)
    # What the scheduler runs agrees: no prefill-only KV where the family has it off.
    assert engine.prefill_only_kv_active == ("prefill_kv" not in info["features_off"])
    hybrid = engine.hybrid_settings
    layer_off = families.LAYER_MODE in info["features_off"]
    assert hybrid.mode == ("token" if layer_off else "layer")


# Token ids, so that the batch lengths are known: a 40-token query and items that make
# prompts of 64 (four 16-token chunks), 49 and 73 tokens.
QUERY_TOKENS, ITEM_TOKENS = 40, (24, 9, 33)


def test_family_layers_run_in_query_chunks(family):
    name, path, engine, _, log = family
    assert engine.hybrid_settings.mode == "layer"
    applied = read_events(log)[0]
    assert applied["event"] == "hybrid_prefill.applied" and applied["whole"] == {}
    assert applied["layers"] == json.loads((path / "config.json").read_text())["num_hidden_layers"]
    reference = TransformersReference(path)
    tok = reference.tokenizer
    words = tok.encode("a quiet river of tall reeds and amber stones " * 20)
    query = words[:QUERY_TOKENS]
    items = [words[QUERY_TOKENS + 3 * i :][:n] for i, n in enumerate(ITEM_TOKENS)]
    labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No", " good")]
    want = reference.score(query, items, labels)
    before = len(read_events(log))
    cold = engine.score(query, items, labels)
    assert max_abs_diff(cold.scores, want) < TOLERANCE
    batches = [e for e in read_events(log)[before:] if e["event"] == "hybrid_prefill.layers"]
    # the three prompts ran as one batch of several requests, in query chunks
    assert any(e["tokens"] > QUERY_TOKENS + max(ITEM_TOKENS) for e in batches), batches
    hit = engine.score(query, items[::-1], labels)
    assert hit.cached_tokens > 0
    assert max_abs_diff(hit.scores, want[::-1]) < TOLERANCE


@pytest.mark.parametrize("family", ["gemma3"], indirect=True)
def test_verify_on_a_running_engine(family):
    """`prefillonly verify`'s report for the every-feature variant, on the engine the
    family tests started (same settings as that variant: one engine start saved)."""
    name, path, engine, _, _ = family
    lines = []
    report = verify.verify(
        path,
        variants=["all features"],
        engines={"all features": engine},
        progress=lines.append,
    )
    assert report.ok, report.table()
    assert report.family == name and [r.variant.name for r in report.results] == ["all features"]
    summary = report.feature_summary()
    assert summary["prefill_kv"]["status"] == "pass"  # windows in the prefill-only attention
    assert summary["hybrid_prefill:layer"]["status"] == "pass"  # whole layers, windows too
    assert summary["several-token labels"]["status"] == "pass"
    table = report.table()
    assert "all features" in table and "per feature" in table
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True
    assert any("all features" in line for line in lines)  # progress as it goes


def test_explicit_request_for_what_the_family_cannot_run_is_refused(tmp_path):
    """Refused while resolving the configuration: no engine starts."""
    qwen3_5 = build_family("qwen3_5", tmp_path / "qwen3_5")
    with pytest.raises(ValueError, match=r"prompt_logprob_cache: Qwen3.5 models cannot run it"):
        Engine(qwen3_5, device="cpu", prompt_logprob_cache=True)
    with pytest.raises(ValueError, match=r"hybrid_prefill_mode layer: Qwen3.5 .*models.md"):
        Engine(qwen3_5, device="cpu", hybrid_prefill_mode="layer")


@pytest.mark.parametrize("name", ["olmo3", "exaone4", "lfm2", "granite_hybrid"])
def test_families_of_this_round_through_the_server(name, family_paths, tmp_path):
    """The families whose SGLang code we correct (sglang_runtime/model_configs.py), EXAONE
    4's backend route (window_models.py) and the recurrent ones on our CPU kernels
    (cpu_support/sglang_patches.py; their engine tests: test_recurrent_families.py)
    through `prefillonly serve` too: /v1/score on a prompt past the window and the scan
    chunks, cold and cached, against transformers."""
    import requests
    from server_process import running_server

    path = family_paths.get(name) or build_family(name, tmp_path / name)
    reference = TransformersReference(path)
    config = json.loads((path / "config.json").read_text())
    probes = verify.make_probes(reference.tokenizer, config)
    labels = list(probes.labels)
    body = {"query": probes.query, "items": list(probes.items), "label_token_ids": labels,
            "apply_softmax": True}  # fmt: skip
    expected = reference.score(probes.query, list(probes.items), labels)
    with running_server(path, tmp_path / "serve.log") as server:
        for _ in range(2):  # cold, then from the prefix cache
            response = requests.post(f"{server.url}/v1/score", json=body, timeout=120)
            assert response.status_code == 200, response.text
            assert max_abs_diff(response.json()["scores"], expected) < TOLERANCE
        assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
