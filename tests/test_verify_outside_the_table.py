"""The way out of "unverified" (issue 74), end to end through the command line, on a tiny
checkpoint of an architecture outside the family table that stock SGLang serves exactly
(StarCoder2: LayerNorms with biases, a GELU MLP without a gate, biased projections).

Before: refused at start, naming verify. A verify that fails (here held to a tolerance no
float32 engine meets, one variant) records nothing, says so, and the start stays refused.
`prefillonly verify --quick` then runs every variant it plans (the architecture allowed:
checking it is what verify is for), passes, records the configuration; and the Engine and
`prefillonly serve` start on it with the features, no opt-in."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from server_process import REPO, ServerProcess

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.models import verified_architectures

ARCHITECTURE = "Starcoder2ForCausalLM"


def build_tiny_starcoder2(out: Path) -> Path:
    """A tiny StarCoder2 (transformers' defaults: biases, LayerNorm, GELU MLP), float32,
    the project's tiny tokenizer, weights widened as the family checkpoints' are."""
    import torch
    from transformers import Starcoder2Config, Starcoder2ForCausalLM

    from prefillonly_sgl.models.tiny import build_tokenizer, common_sizes
    from prefillonly_sgl.models.tiny_checkpoint_saving import save_checkpoint

    tokenizer = build_tokenizer()
    config = Starcoder2Config(**common_sizes(tokenizer))
    torch.manual_seed(0)
    return save_checkpoint(Starcoder2ForCausalLM(config), tokenizer, out, seed=0)


@pytest.fixture(scope="module")
def starcoder2(tmp_path_factory):
    return build_tiny_starcoder2(tmp_path_factory.mktemp("tiny-starcoder2"))


def _verify(folder: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFILLONLY_CACHE": str(cache)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-m", "prefillonly_sgl", "verify", str(folder), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)


def test_verify_records_a_passing_architecture_and_it_then_starts(
    starcoder2, tmp_path, monkeypatch
):
    cache = tmp_path / "cache"
    monkeypatch.setenv("PREFILLONLY_CACHE", str(cache))
    with pytest.raises(verified_architectures.UnverifiedArchitectureError, match="verify"):
        runtime_config.resolve(starcoder2, device="cpu")

    failed = _verify(starcoder2, cache, "--variant", "all features", "--tolerance", "1e-12")
    out = failed.stdout + failed.stderr
    assert failed.returncode == 1, out[-3000:]
    assert "not recorded (failed: all features)" in out
    assert verified_architectures.find_record(starcoder2) is None
    with pytest.raises(verified_architectures.UnverifiedArchitectureError):
        runtime_config.resolve(starcoder2, device="cpu")

    passed = _verify(starcoder2, cache, "--quick")
    out = passed.stdout + passed.stderr
    assert passed.returncode == 0, out[-3000:]
    assert "not run" not in out.split("[verify] all features")[0]  # it ran the features
    assert "recorded: this configuration now starts with the features on" in out
    record = verified_architectures.find_record(starcoder2)
    assert record is not None and record["architectures"] == [ARCHITECTURE]
    assert runtime_config.resolve(starcoder2, device="cpu").features == tuple(FEATURES)

    from prefillonly_sgl import Engine

    with Engine(starcoder2, device="cpu", dtype="float32", max_total_tokens=4096) as engine:
        assert engine.features == tuple(FEATURES) and engine.prefill_only_kv_active
        result = engine.score([5, 6, 7, 8], [[9, 10]], [11, 12])
        assert len(result.scores[0]) == 2

    server = ServerProcess(starcoder2, tmp_path / "serve.log")
    try:
        server.wait_ready()
        info = requests.get(f"{server.url}/server_info", timeout=30).json()["prefillonly"]
        assert info["features"] == list(FEATURES), info
    finally:
        server.stop()
