"""vLLM's generative-scoring tests: vllm-project/vllm
tests/entrypoints/generate/generative_scoring/test_generative_scoring.py (Apache-2.0).

Not ported: they are unit tests of vLLM's ServingGenerativeScoring class (its protocol
models, `_compute_probabilities`, `_build_prompts`) driven by a mocked AsyncLLM, behind
vLLM's POST /generative_scoring, which this server does not serve. Its request carries
SGLang's /v1/score fields (query, items, label_token_ids, apply_softmax, item_first), and
that path, with SGLang's answer, is covered by SGLang's own tests (tests/peers/sglang/).
"""

import pytest


@pytest.mark.skip(reason="vLLM's /generative_scoring is not served: the module tests vLLM's "
                  "serving class with a mocked engine; SGLang's /v1/score takes the same "
                  "fields (tests/peers/sglang/)")  # fmt: skip
def test_generative_scoring():
    """TestProtocolModels, TestProbabilityComputation, TestValidation, TestPromptBuilding,
    TestGeneration."""
