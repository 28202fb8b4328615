"""benchmarks/gpu_prefill.py (issue 48's GPU script) on CPU with tiny shapes: the same code
a lent card runs, with the CPU attention backend in the place of FlashInfer and float32
(tolerance 1e-4 against float32 references).

It checks what the card's numbers rest on: the project's query-chunk attention (cold, in
chunks and whole, and items behind a cached prefix at scattered pool slots) equals float32
attention; transformers' Llama run layer by layer in query chunks through
harness/hf_llama_chunks.py gives the plain forward's log-probabilities; the KV kept is
2 x layers x KV heads x head dim x bytes per kept token, for every token (stock) and for
the reusable prefix only (prefill-only KV). No timing is asserted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_prefill  # noqa: E402

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_prefill")
    code = gpu_prefill.main(["--tiny", "--device", "cpu", "--out", str(out), "--repeats", "1"])
    written = json.loads((out / "results.json").read_text())
    written["markdown"] = (out / "results.md").read_text()
    written["exit"] = code
    return written


def test_every_part_ran(results):
    assert results["errors"] == {}
    assert results["exit"] == 0
    assert set(results["part_seconds"]) == {"attention", "hybrid", "kv"}
    for heading in ("## a. Attention", "## b. Hybrid prefilling", "## c. KV kept"):
        assert heading in results["markdown"]


def test_attention_equals_float32_reference(results):
    rows = results["attention"]
    lengths = gpu_prefill.SMALL["attention_lengths"]
    assert {(r["case"], r["tokens"]) for r in rows} == {
        (case, n) for n in lengths for case in ("cold", "shared prefix")
    }
    for row in rows:
        methods = [k for k in row if isinstance(row[k], dict)]
        ours = [m for m in methods if m.startswith("ours")]
        assert ours, row
        if row["case"] == "cold":
            assert any("chunks of" in m for m in ours)  # the hybrid path's query chunks
        else:
            assert row["prefix"] > 0 and row["items"] == gpu_prefill.SMALL["items"]
        assert row["sdpa_max_err"] < TOLERANCE
        for method in ours:
            assert row[method]["max_err"] < TOLERANCE, (row["case"], row["tokens"], method)
            assert row[method]["flop_per_s"] > 0


def test_layer_chunks_give_the_plain_forwards_logprobs(results):
    for row in results["hybrid_prefill"]:
        assert set(row["chunks"]) == {str(c) for c in gpu_prefill.SMALL["layer_chunks"]}
        for chunk, entry in row["chunks"].items():
            assert int(chunk) < row["tokens"]  # several chunks per layer
            assert entry["max_logprob_diff"] < TOLERANCE, (row["tokens"], chunk)


def test_kv_bytes_per_token(results):
    kv = results["kv"]
    shapes = gpu_prefill.TINY
    expected = (
        2
        * shapes["num_hidden_layers"]
        * shapes["num_key_value_heads"]
        * (shapes["hidden_size"] // shapes["num_attention_heads"])
        * 4  # float32
    )
    assert kv["expected_bytes_per_token"] == expected
    stock, ours = kv["stock (every token)"], kv["prefill-only (reusable prefix)"]
    assert stock["tokens_kept"] == kv["tokens"]
    assert ours["tokens_kept"] == kv["reusable_prefix"] < kv["tokens"]
    assert stock["bytes_per_kept_token"] == ours["bytes_per_kept_token"] == expected
    assert ours["bytes"] == expected * kv["reusable_prefix"]


def test_a_failing_part_is_recorded_and_the_next_runs(tmp_path, monkeypatch):
    def out_of_memory(*args):
        raise RuntimeError("CUDA out of memory (raised by the test)")

    monkeypatch.setattr(gpu_prefill, "part_hybrid", out_of_memory)
    argv = ["--tiny", "--device", "cpu", "--out", str(tmp_path), "--parts", "hybrid,kv"]
    assert gpu_prefill.main(argv) == 1
    written = json.loads((tmp_path / "results.json").read_text())
    assert "CUDA out of memory" in written["errors"]["hybrid"]
    assert "kv" not in written["errors"]
    assert written["kv"]["tokens"] == gpu_prefill.SMALL["kv_length"]
    assert "**hybrid failed:**" in (tmp_path / "results.md").read_text()


def test_unknown_part_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        gpu_prefill.main(["--tiny", "--out", str(tmp_path), "--parts", "attention,typo"])
    assert exit_info.value.code == 2
    assert "unknown part(s) typo" in capsys.readouterr().err


def test_the_sdpa_stand_in_keeps_b_and_c_measurable(tmp_path):
    """Where FlashInfer fails on a card, the layer chunks attend with SDPA: the same
    log-probabilities, and a. keeps SDPA's rows only."""
    argv = ["--tiny", "--device", "cpu", "--out", str(tmp_path), "--attention", "sdpa"]
    assert gpu_prefill.main([*argv, "--repeats", "1"]) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["attention_kind"] == "sdpa"
    for row in written["attention"]:
        assert [k for k in row if isinstance(row[k], dict)] == ["sdpa"]
    for row in written["hybrid_prefill"]:
        for entry in row["chunks"].values():
            assert entry["max_logprob_diff"] < TOLERANCE
    assert (
        written["kv"]["prefill-only (reusable prefix)"]["tokens_kept"]
        == (written["kv"]["reusable_prefix"])
    )
