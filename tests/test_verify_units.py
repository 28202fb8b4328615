"""`prefillonly verify`'s plain parts, without SGLang: its variants for a family, its
probes, differences and report (tests/test_model_families.py runs it on an engine)."""

from __future__ import annotations

import json
import math

import pytest

from prefillonly_sgl import cli
from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.verification import verify
from prefillonly_sgl.verification.verify import Check, Report, Variant, VariantResult


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return build_family("gemma3", tmp_path_factory.mktemp("gemma3") / "gemma3")


def _folder(tmp_path, architectures):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures}))
    return str(tmp_path)


def test_variants_leave_out_what_the_family_makes_identical(tmp_path):
    qwen3_5 = _folder(tmp_path, ["Qwen3_5ForCausalLM"])
    first, more, skipped = verify.plan_variants(qwen3_5, "cpu", "float32", quick=True)
    assert [v.name for v in first] == ["all features", "stock SGLang"]
    # Qwen3.5 runs token mode anyway (its linear-attention layers are not token-wise), and
    # its prompt logprobs are off anyway.
    assert set(skipped) == {"hybrid token mode", "prompt_logprobs off"}
    assert first[0].hybrid_mode == "token" and "prefill_kv" in first[0].features
    assert first[1].features == ()
    assert [v.name for v in more] == [
        "prefill_attention off", "prefill_kv off", "jct_scheduler off", "hybrid_prefill off",
    ]  # fmt: skip
    # Llama and Gemma 3 (sliding windows, sandwich norms) alike run whole layers.
    for arch in ("LlamaForCausalLM", "Gemma3ForCausalLM"):
        folder = _folder(tmp_path / arch, [arch])
        first, more, skipped = verify.plan_variants(folder, "cpu", "float32", quick=False)
        assert [v.name for v in first] == ["all features", "hybrid token mode"]
        assert [v.hybrid_mode for v in first] == ["layer", "token"]
        assert more[-1].name == "stock SGLang" and skipped == {}
        assert first[0].settings == {"hybrid_prefill_chunk_size": verify.SMALL_CHUNK}


def test_probes_cross_the_sliding_window_and_the_chunk(gemma):
    from transformers import AutoTokenizer

    config = json.loads((gemma / "config.json").read_text())
    assert verify.sliding_window_of(config) == 16
    probes = verify.make_probes(AutoTokenizer.from_pretrained(gemma), config)
    assert probes.long_tokens > 2 * 16 + 8 and probes.long_tokens > 3 * verify.SMALL_CHUNK
    assert len(probes.labels) == 2 and probes.labels[0] != probes.labels[1]
    assert any(len(label) > 1 for label in probes.sequences)
    # No window where no layer slides (Qwen2's use_sliding_window false, full layer types).
    assert verify.sliding_window_of({"sliding_window": 4096, "use_sliding_window": False}) is None
    full_only = {"sliding_window": 8, "layer_types": ["full_attention"]}
    assert verify.sliding_window_of(full_only) is None
    assert verify.sliding_window_of({"text_config": {"sliding_window": 8}}) == 8


def test_max_abs_diff():
    assert verify.max_abs_diff([[0.5, 0.25], [None, 1.0]], [[0.5, 0.5], [None, 1.0]]) == 0.25
    assert verify.max_abs_diff([], []) == 0.0
    assert verify.max_abs_diff([float("nan")], [0.0]) == math.inf
    with pytest.raises(ValueError):
        verify.max_abs_diff([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        verify.max_abs_diff([None], [1.0])


def _result(name, features, mode, diff, error=None):
    checks = {probe: Check(diff, diff <= 1e-4) for probe in verify.PROBES}
    return VariantResult(Variant(name, {}, features, mode), checks, error)


def test_report_per_feature_and_table():
    report = Report(
        model="m",
        family="gemma3",
        architectures=["Gemma3ForCausalLM"],
        device="cpu",
        dtype="float32",
        tolerance=1e-4,
        features_off={"prefill_kv": "sliding windows"},
        results=[
            _result("all features", ("prefill_attention", "hybrid_prefill"), "token", 2e-6),
            _result("stock SGLang", (), None, 3e-2),
        ],
        skipped={"hybrid token mode": "the same configuration"},
    )
    summary = report.feature_summary()
    assert summary["prefill_attention"] == {"status": "pass", "max_diff": 2e-6}
    assert summary["prefill_kv"]["status"] == "off: sliding windows"
    assert summary["hybrid_prefill:token"]["status"] == "pass"
    assert summary["hybrid_prefill:layer"]["status"] == "not run"
    assert summary["jct_scheduler"]["status"] == "not run"
    # Stock SGLang is the baseline: shown, not judged (gpt-oss does not start there).
    assert summary["several-token labels"]["status"] == "pass"
    assert summary["stock SGLang"]["status"] == "FAIL"
    assert report.ok
    table = report.table()
    assert "3.0e-02 X" in table and "FAIL (baseline)" in table
    assert "not run: hybrid token mode" in table
    assert json.loads(json.dumps(report.to_dict()))["variants"][1]["ok"] is False
    report.results.append(_result("prefill_kv off", ("prefill_attention",), None, 1e-2))
    assert not report.ok
    assert report.feature_summary()["several-token labels"]["status"] == "FAIL"


def test_an_engine_that_does_not_start_fails_every_feature_it_had():
    report = Report("m", None, [], "cpu", "float32", 1e-4, {}, [], {})
    report.results.append(
        VariantResult(Variant("all features", {}, ("prefill_attention",), None), {}, "boom")
    )
    assert report.feature_summary()["prefill_attention"]["status"] == "FAIL: boom"
    assert "FAIL: boom" in report.table()


def test_the_command_line():
    args = cli.build_parser().parse_args(
        ["verify", "/models/x", "--quick", "--json", "-", "--tolerance", "1e-3"]
    )
    assert args.handler is verify.main
    assert (args.model, args.quick, args.json, args.tolerance) == ("/models/x", True, "-", 1e-3)
    assert (args.device, args.dtype, args.variants) == ("cpu", "float32", None)
