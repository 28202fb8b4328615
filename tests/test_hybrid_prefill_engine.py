"""Hybrid prefilling on the real engine (tiny Llama, CPU, float32): with small chunks, so
that these prompts are cut into several, the scores equal the unchunked engine's (float
rounding) and a plain transformers forward (1e-4): prompt lengths that are and are not a
multiple of the chunk, several requests in one batch, cache hits, with and without
prefill-only KV, whole layers in query chunks (mode "layer", the default) and token-wise
modules only (mode "token"), and SGLang's setwise readout (labels at every anchor)."""

from __future__ import annotations

import asyncio
import os

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import FORWARD_LOG
from prefillonly_sgl.machine.environment import HYBRID_LOG as LOG_ENV

pytestmark = pytest.mark.slow  # engines per hybrid mode

TOLERANCE = 1e-4  # vs transformers
# chunked vs unchunked: the same values up to float rounding. 1e-5, not 1e-6: the
# scheduler may batch a call's items differently in the two engines (timing), and a
# batch's hits behind one prefix sum their attention in another order (shared-prefix
# groups): ~1e-6 apart in float32 probabilities.
SAME = 1e-5
POOL = 4096
ANCHOR = 3  # the setwise readout's token (its id: the tiny tokenizer's is arbitrary)

QUERY = "User profile: likes science fiction, history books and long walks.\n" * 6
ITEMS = [  # different lengths, one of them long: several chunks of every size below
    "Item: a documentary about the history of the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction and walks, " * 30 + "Relevant?",
]


def _engine(path, **kwargs):
    return Engine(path, device="cpu", dtype="float32", max_total_tokens=POOL, **kwargs)


@pytest.fixture(scope="module")
def unchunked(tiny_llama_path, labels):
    with _engine(tiny_llama_path, hybrid_prefill=False) as engine:
        yield _scores(engine, labels)


def _scores(engine, labels) -> dict:
    """Each call alone, and all at once (one extend batch of several requests)."""
    alone = {
        "cold": engine.score(QUERY, ITEMS, labels).scores,  # cold, then the rest
        "hit": engine.score(QUERY, ITEMS[::-1], labels).scores,  # behind a cached prefix
        "no-prefix": engine.score("", ITEMS, labels).scores,
        "ids": engine.score([5] * 250, [[7] * 64, [9] * 3], labels).scores,
    }
    if engine.prefill_only_kv_active:
        # the setwise readout (issue 75): the anchors' rows survive the chunks; the
        # candidates' matrix as rows (stock SGLang without prefill-only KV refuses it)
        setwise = [t for k in range(6) for t in ([8 + k] * 30 + [ANCHOR])]
        (matrix,) = engine.score([5] * 120, [setwise], labels, score_extraction_token=ANCHOR).scores
        alone["setwise"] = matrix

    async def together():
        calls = [engine.async_score(f"{i} {QUERY}", ITEMS, labels) for i in range(3)]
        return [r.scores for r in await asyncio.gather(*calls)]

    engine.score("warm", ["up"], labels)  # SGLang answers on the loop of its first call
    alone["batch"] = [
        row for rows in engine._sgl.loop.run_until_complete(together()) for row in rows
    ]
    return alone


@pytest.mark.parametrize(
    "chunk, mode, kv, whole",
    [(64, "layer", True, None), (100, "layer", False, None), (100, "token", True, 150)],
    ids=["chunk64-layer-kv", "chunk100-layer-stock-kv", "chunk100-token-kv-whole150"],
)
def test_chunked_scores_equal_the_unchunked_ones(
    tiny_llama_path, labels, reference, unchunked, chunk, mode, kv, whole, tmp_path
):
    log = tmp_path / "hybrid.log"
    os.environ[LOG_ENV] = str(log)  # read by the spawned scheduler
    try:
        engine = _engine(
            tiny_llama_path,
            hybrid_prefill_chunk_size=chunk,
            hybrid_prefill_mode=mode,
            prefill_only_kv=kv,
            **({} if whole is None else {"hybrid_prefill_whole_up_to": whole}),
        )
    finally:
        del os.environ[LOG_ENV]
    with engine:
        assert "hybrid_prefill" in engine.features
        assert engine.hybrid_settings.chunk_size == chunk
        got = _scores(engine, labels)
    events = read_events(log)
    layers = 2 if mode == "layer" else 0
    assert events[0] == {
        "event": "hybrid_prefill.applied",
        "chunk": chunk,
        "whole_up_to": whole or chunk,  # an explicit chunk size: chunks from it on
        "mode": mode,
        "chunked": {"mlp": 2, "rms_norm": 5, "rotary": 1},
        "layers": layers,
        "whole": {},
    }
    # the long prompts really ran in chunks: whole layers (their modules then see one
    # chunk at a time; the final norm still chunks), or every kind of token-wise module
    kinds = ("layers", "RMSNorm") if mode == "layer" else ("LlamaMLP", "RMSNorm", "RotaryEmbedding")
    ran = {e["module"] for e in events if e["event"] == "hybrid_prefill.chunked"}
    ran |= {"layers"} if any(e["event"] == "hybrid_prefill.layers" for e in events) else set()
    for kind in kinds:
        assert kind in ran, (kind, ran)
    # only forwards past the limit ran in chunks (shorter ones, here too, whole)
    sizes = [e["tokens"] for e in events if "tokens" in e]
    assert sizes and min(sizes) > (whole or chunk)
    if mode == "layer":
        assert "LlamaMLP" not in ran
    for case, rows in got.items():
        assert max_abs_diff(rows, unchunked[case]) < SAME, case
    assert max_abs_diff(got["cold"], reference.score(QUERY, ITEMS, labels)) < TOLERANCE
    assert max_abs_diff(got["no-prefix"], reference.score("", ITEMS, labels)) < TOLERANCE


def test_the_chunk_size_needs_hybrid_prefilling(tiny_llama_path):
    with pytest.raises(ValueError, match="hybrid_prefill_chunk_size applies"):
        _engine(tiny_llama_path, hybrid_prefill=False, hybrid_prefill_chunk_size=64)
    with pytest.raises(ValueError, match="hybrid_prefill_mode applies"):
        _engine(tiny_llama_path, hybrid_prefill=False, hybrid_prefill_mode="token")
    with pytest.raises(ValueError, match="mode must be one of layer, token, got 'rows'"):
        _engine(tiny_llama_path, hybrid_prefill_mode="rows")
    with pytest.raises(ValueError, match="chunk size must be an integer >= 16"):
        _engine(tiny_llama_path, hybrid_prefill_chunk_size=4)


def test_by_default_only_forwards_past_stocks_batch_are_chunked(tiny_llama_path, labels, tmp_path):
    """With no chunk size or limit given, the scheduler reads the limit from what SGLang
    resolved for it (its prefill token budget: chunked_prefill_size 4096 on this CPU
    engine, under max_prefill_tokens 16384), so a 3,000-token forward, past the
    1024-token chunk, runs whole (issue 62's card run: chunking every batch past one
    chunk cost ours three quarters of stock's throughput there)."""
    log, forwards = tmp_path / "hybrid.log", tmp_path / "forwards.log"
    os.environ[LOG_ENV], os.environ[FORWARD_LOG] = str(log), str(forwards)
    try:
        engine = _engine(tiny_llama_path)
    finally:
        del os.environ[LOG_ENV], os.environ[FORWARD_LOG]
    with engine:
        info = engine.get_server_info()
        budget = min(info["chunked_prefill_size"], info["max_prefill_tokens"])
        engine.score([5] * 3000, [[7] * 8], labels)
    events = read_events(log)
    assert events[0]["event"] == "hybrid_prefill.applied"
    assert events[0]["chunk"] == 1024 and events[0]["whole_up_to"] == budget == 4096
    assert max(sum(f["new"]) for f in read_events(forwards, "forward")) > 1024
    assert [e for e in events if "tokens" in e] == []  # nothing ran in chunks
