"""Shared fixtures. Engines and servers start once (start-up ~15-30 s on CPU): the tiny
engine and the DSL-apps server once per session, other servers once per module
(``tiny_server``).

Markers (pyproject.toml): ``slow`` on the modules that start gateways, Ray, several servers
or run long load (``./run test -m "not slow"`` is the quick subset); ``faults`` (fault
injection) and ``kit`` (the GPU kit's build) are left out of ``./run test`` and run by CI
after it: ``./run test -m "faults or kit"`` (docs: README).
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import forked_server
import pytest
import start_counts
from server_process import running_server

from prefillonly_sgl.models.tiny import build_tiny_model

TESTS = Path(__file__).parent


def pytest_configure(config):
    start_counts.install()
    # Every Engine and server of the suite forks its SGLang workers from a forkserver
    # that imported SGLang once (sglang_runtime/worker_forkserver.py): ~4 s a start
    # instead of ~20 on 2 cores. Servers inherit it (each starts its own forkserver).
    # SGLang's own spawn runs in test_engine_lifecycle.py's failing-start script.
    os.environ.setdefault("PREFILLONLY_WORKER_START", "forkserver")
    # That forkserver also imports the servers' modules: the suite's servers are forked
    # from it, already imported (tests/forked_server.py).
    multiprocessing.set_forkserver_preload(forked_server.SERVER_MODULES)


def pytest_unconfigure(config):
    forked_server.stop_all()


def pytest_terminal_summary(terminalreporter):
    for line in start_counts.summary():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_llama_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen2_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def tiny_llama_reference(tiny_llama_path):
    from prefillonly_sgl.verification.reference import TransformersReference

    return TransformersReference(tiny_llama_path)


@pytest.fixture(scope="session")
def yes_no_labels(tiny_llama_reference):
    """Token ids of " Yes" and " No" in the tiny models' tokenizer."""
    tok = tiny_llama_reference.tokenizer
    return [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]


@pytest.fixture(scope="session")
def tiny_engine(tiny_llama_path):
    """One Engine on the tiny Llama (float32, CPU) for every module that needs a plain one."""
    from prefillonly_sgl import Engine

    with Engine(tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=8192) as engine:
        yield engine


@pytest.fixture(scope="session")
def tiny_qwen2_engine(tiny_qwen2_path):
    """One Engine on the tiny Qwen2 for the session (test_engine_tiny_models.py and the
    ported multi-architecture tests); 64-token hybrid chunks, so a call's batch runs its
    decoder layers in query chunks."""
    from prefillonly_sgl import Engine

    with Engine(
        tiny_qwen2_path,
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        hybrid_prefill_chunk_size=64,
    ) as engine:
        yield engine


def tiny_server(*args: str, scope: str = "module", name: str = "server"):
    """A fixture called ``name``: ``prefillonly serve`` on the tiny Llama with ``args``,
    started once per module (or ``scope``)."""

    @pytest.fixture(scope=scope, name=name)
    def server(tiny_llama_path, tmp_path_factory):
        log = tmp_path_factory.mktemp("server") / "serve.log"
        with running_server(tiny_llama_path, log, *args) as srv:
            yield srv

    return server


# The DSL apps (typed endpoints, /v1/rerank, /v1/classify) on one server for the session:
# test_app_endpoints.py and test_ranking_apis.py.
apps_server = tiny_server(
    "--app", str(TESTS / "dsl_app_example.py"),
    "--app", str(TESTS / "ranking_app_example.py"),
    "--classify", "review_sentiment",
    "--rerank-method", "judge",  # the tiny model would get query likelihood
    scope="session",
    name="apps_server",
)  # fmt: skip


# The peers' own answers where one path is spoken by two peers (docs/server.md, "Peer
# conventions on one path"): SGLang's /v1/rerank list and vLLM's /v1/systemone, for the
# ported peer tests (tests/peers/), with SGLang's custom logit processors on.
peer_conventions_server = tiny_server(
    "--rerank-answer", "sglang",
    "--systemone-conventions", "vllm",
    "--enable-custom-logit-processor",  # SGLang's own test of it runs here too
    scope="session",
    name="peer_conventions_server",
)  # fmt: skip


@pytest.fixture(scope="session")
def default_model_path():
    from prefillonly_sgl.models import default_model

    return default_model.default_model_path()


@pytest.fixture(scope="session")
def default_server(default_model_path, tmp_path_factory):
    """`prefillonly serve` on the default model with no --app (the built-in endpoints),
    once for the session: test_decisions_server.py and test_reranking.py."""
    log = tmp_path_factory.mktemp("default-model-serve") / "server.log"
    with running_server(default_model_path, log) as server:
        yield server


@pytest.fixture(scope="session")
def default_engine():
    """One Engine on the default model (float32, CPU) for the session: test_default_model.py
    and the ported SGLang Engine tests (tests/peers/sglang/)."""
    from prefillonly_sgl import Engine

    with Engine(device="cpu", dtype="float32") as engine:  # model=None: the default model
        yield engine


@pytest.fixture(scope="session")
def default_reference(default_model_path):
    from prefillonly_sgl.verification.reference import TransformersReference

    return TransformersReference(default_model_path)


# Short names for modules on the tiny Llama; modules on other models define their own.
@pytest.fixture(scope="session")
def reference(tiny_llama_reference):
    return tiny_llama_reference


@pytest.fixture(scope="session")
def labels(yes_no_labels):
    return yes_no_labels


def start_logging_forwards(log: Path, start):
    """`start()` (an Engine's or server's start) with its scheduler appending one line per
    extend forward to `log`: PREFILLONLY_FORWARD_LOG is read once by the workers as they
    start, so it is set only meanwhile (the session's other engines log nothing)."""
    from prefillonly_sgl.machine.environment import FORWARD_LOG

    saved = os.environ.get(FORWARD_LOG)
    os.environ[FORWARD_LOG] = str(log)
    try:
        return start()
    finally:
        if saved is None:
            os.environ.pop(FORWARD_LOG)
        else:
            os.environ[FORWARD_LOG] = saved


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


# openai's client and the served model's name on a module's `server` fixture (the module
# defines `server`; the servers take no API key, so any key is accepted): test_openai_doors.py
# and the peers' ported tests (tests/peers/).
@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.Client(api_key="sk-123456", base_url=f"{server.url}/v1", max_retries=0)


@pytest.fixture(scope="module")
def model(server):
    """The served model's name, as /v1/models lists it."""
    import requests

    return requests.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
