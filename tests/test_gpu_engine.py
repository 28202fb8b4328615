"""The GPU path (FlashInfer) with prefill-only attention and KV, on the default model.

Skipped without CUDA (the CI and development machines have none). On a CUDA machine
(`./run test` there installs stock sglang with flashinfer) it checks what the CPU tests
check: prefill-only KV is active (the score limit is the context, not the 1024-token
pool), label probabilities equal stock SGLang's and a float32 transformers forward with
no shared prefix, a shared prefix first and repeated (cache hit), items of different
lengths, and a prompt 3x longer than the pool. FlashInfer's prefill runs in bfloat16, so
the tolerance is 2e-2 on probabilities softmaxed over two labels.

PREFILLONLY_GPU_TEST_DEVICE=cpu runs the same checks on CPU (float32, 1e-4) to check
this file itself where no GPU is at hand.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import max_abs_diff

from prefillonly_sgl import STOCK_SGLANG, Engine
from prefillonly_sgl.models.default_model import default_model_path
from prefillonly_sgl.verification.reference import TransformersReference

DEVICE = os.environ.get("PREFILLONLY_GPU_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA GPU (set PREFILLONLY_GPU_TEST_DEVICE=cpu to run it on CPU)",
)
DTYPE = "bfloat16" if DEVICE == "cuda" else "float32"
TOLERANCE = 2e-2 if DEVICE == "cuda" else 1e-4
POOL = 1024

PROFILE = "User profile: likes science fiction, history books and long walks. " * 8 + "\n"
ITEMS = [
    "Item: a documentary about the moon landing. Is it relevant? Answer:",
    "Item: socks. Is it relevant? Answer:",
    "Item: " + "a long book about the history of science fiction, " * 12 + "Relevant? Answer:",
]
LONG_ITEM = "Item: " + "a long book about the history of science fiction and walks, " * 250


def _start(model, **kwargs):
    return Engine(model, device=DEVICE, dtype=DTYPE, max_total_tokens=POOL, **kwargs)


CALLS = [("", ITEMS), (PROFILE, ITEMS), (PROFILE, ITEMS[::-1])]


@pytest.fixture(scope="module")
def setup():
    model = default_model_path()
    ref = TransformersReference(model)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    with _start(model, **STOCK_SGLANG) as stock:
        stock_limit = stock.limits.scoring_prompt_tokens
        stock_scores = [stock.score(q, items, labels).scores for q, items in CALLS]
    with _start(model) as ours:
        yield ours, ref, labels, stock_limit, stock_scores


def test_prefill_only_kv_is_active(setup):
    ours, _, _, stock_limit, _ = setup
    assert ours.features == (
        "prefill_attention",
        "prefill_kv",
        "jct_scheduler",
        "hybrid_prefill",
        "prompt_logprobs",
    )
    assert ours.prefill_only_kv_active
    # The scheduler reports the context-bound limit only where prefill-only KV is active.
    assert stock_limit < POOL < 3 * POOL < ours.limits.scoring_prompt_tokens


def test_parity_with_stock_and_transformers(setup):
    ours, ref, labels, _, stock_scores = setup
    for (query, items), stock in zip(CALLS, stock_scores):  # the 3rd call hits the cache
        got = ours.score(query, items, labels).scores
        assert max_abs_diff(got, ref.score(query, items, labels)) < TOLERANCE
        assert max_abs_diff(got, stock) < TOLERANCE


def test_prompt_longer_than_the_pool(setup):
    ours, ref, labels, _, _ = setup
    assert len(ref.prompt_ids(PROFILE, LONG_ITEM)) > 2.5 * POOL
    got = ours.score(PROFILE, [LONG_ITEM, ITEMS[1]], labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, [LONG_ITEM, ITEMS[1]], labels)) < TOLERANCE
