"""Shared fixtures. Engines are started once per test module (start-up ~15 s on CPU)."""

from __future__ import annotations

import pytest

from prefillonly_sgl.models.tiny import build_tiny_model


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_reference(tiny_llama_path):
    from prefillonly_sgl.reference import TransformersReference

    return TransformersReference(tiny_llama_path)


@pytest.fixture(scope="session")
def yes_no_labels(tiny_llama_reference):
    """Token ids of " Yes" and " No" in the tiny models' tokenizer."""
    tok = tiny_llama_reference.tokenizer
    return [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]


# Short names for modules on the tiny Llama; modules on other models define their own.
@pytest.fixture(scope="session")
def reference(tiny_llama_reference):
    return tiny_llama_reference


@pytest.fixture(scope="session")
def labels(yes_no_labels):
    return yes_no_labels


def max_abs_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert len(a) == len(b), f"{len(a)} rows vs {len(b)}"
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b, strict=True))


def counting_backend(engine):
    """The real local backend on ``engine``, counting what it sends to SGLang: the
    requests (``requests``) and their items (``items_sent``)."""
    from prefillonly_sgl.dsl import LocalEngineBackend

    class CountingBackend(LocalEngineBackend):
        def __init__(self):
            super().__init__(engine)
            self.requests, self.items_sent = [], 0

        async def score(self, request):
            self.requests.append(request)
            self.items_sent += len(request.items)
            return await super().score(request)

    return CountingBackend()
