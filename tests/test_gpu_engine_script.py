"""benchmarks/gpu_engine.py's plain pieces (no engine; its modules in benchmarks/card_engine/):
its arguments, workloads, warm-ups, the systems' settings on a card (resolved here, nothing
started), the multi-item scoring reference and the report. The script itself runs end to
end, on the engine kit, in tests/test_gpu_kit.py (tiny shapes, CPU)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_engine  # noqa: E402
from card_engine import (  # noqa: E402
    diagnostics,
    model,
    orchestration,
    parts,
    systems,
    workloads,
)
from card_engine import report as report_module  # noqa: E402
from harness import stats  # noqa: E402


def test_unknown_parts_and_systems_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--parts", "correctness,speed"])
    assert "unknown parts ['speed']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--systems", "vllm"])
    assert "--systems: choose from stock, ours, stock-mis" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--models", "qwen3-0.6b,gpt-9"])
    assert "unknown models ['gpt-9']" in capsys.readouterr().err
    args = gpu_engine.parse_args(["--tiny", "--device", "cpu", "--systems", "ours"])
    assert args.systems == ["ours"] and args.dtype == "float32" and args.models == ["tiny"]
    assert args.parts == list(systems.DEFAULT_PARTS) and args.overlap
    assert "checks" in systems.PARTS and "checks" not in args.parts  # a call of their own
    assert args.fused_ops == "torch" and args.fused_ops_ab == []
    assert gpu_engine.parse_args([]).dtype == "bfloat16"  # the card's


def test_quick_is_the_first_card_call_and_ends_within_540_s():
    args = gpu_engine.parse_args(["--quick"])
    assert args.models == ["qwen3-0.6b"]
    # the items figure first, then recommendation, the profile, and the card checks
    assert args.parts == ["correctness", "items", "recommendation", "profile", "checks"]
    assert args.deadline == systems.QUICK_DEADLINE and not args.graphs_check
    # the quick call ends by itself within 540 s, the kit's install (~15-20 s) included
    assert systems.QUICK_DEADLINE + systems.GRACE <= 540 - 20
    assert systems.DEADLINE + systems.GRACE <= 540 - 15
    assert systems.CHECKS_LIMIT < 200  # the card checks end while the engines start
    assert not gpu_engine.parse_args(["--quick", "--device", "cpu"]).graphs_check
    assert gpu_engine.parse_args(["--quick", "--graphs-check"]).graphs_check
    # every system, ours' A/B variants too; the fused ops A/B for stock and ours
    assert args.systems == ["stock", "ours", "stock-mis", "ours-8k", "ours-1pass"]
    assert args.fused_ops == "torch" and args.fused_ops_ab == ["stock", "ours"]
    assert gpu_engine.parse_args(["--quick", "--fused-ops-ab", "none"]).fused_ops_ab == []
    compiled = gpu_engine.parse_args(["--quick", "--fused-ops", "compile"])
    assert systems.system_env("ours", compiled.fused_ops)["SGLANG_FORCE_FUSED_OP_BACKEND"] == (
        "torch_compile"
    )
    assert systems.ab_label("ours", "torch") == "ours-compile"
    assert systems.ab_label("stock", "compile") == "stock-torch"
    env = systems.system_env("ours-1pass", "torch")
    assert env == {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch", "PREFILLONLY_CUDA_ONE_PASS": "1"}
    sizes = args.sizes
    # the items grid (issue 83, item 8): >= 6 rates between 0.7x and 1.5x of the best
    # system's capacity, two passes, the bursts repeated, a few hundred requests a rate
    grid = sizes["grid"]
    assert len([f for f in grid["factors"] if 0.7 <= f <= 1.5]) >= 6
    assert min(grid["factors"]) < 0.7 and max(grid["factors"]) == 1.5
    assert grid["passes"] == 2 and grid["bursts"] == 2 and grid["least"] >= 100
    # the recommendation's rates shorter in the quick call, two of them
    assert sizes["hold_seconds"] == 6 and sizes["hold_requests"] == 150
    assert len(sizes["rate_factors"]) == 2
    assert gpu_engine.parse_args([]).sizes["hold_requests"] == 300  # a full run's
    args = gpu_engine.parse_args(["--quick", "--parts", "items", "--rate-factors", "0.5,1,2"])
    assert args.parts == ["items"] and args.sizes["rate_factors"] == (0.5, 1.0, 2.0)
    args = gpu_engine.parse_args(
        ["--grid-factors", "1,0.5", "--passes", "1", "--grid-requests", "50-80"]
    )
    grid = args.sizes["grid"]
    assert grid["factors"] == (0.5, 1.0) and grid["passes"] == 1
    assert (grid["least"], grid["most"]) == (50, 80)
    assert gpu_engine.parse_args(["--model", "llama-3.2-1b"]).models == ["llama-3.2-1b"]
    # its CPU rehearsal: a tiny model of the same family
    tiny = gpu_engine.parse_args(["--quick", "--tiny", "--device", "cpu"])
    assert [systems.SHAPES[m]["arch"] for m in tiny.models] == ["qwen3"]
    assert tiny.deadline == systems.TINY_DEADLINE < 900  # the kit test's limit on the run


def test_the_grid_is_sized_to_fit_and_the_figure_is_the_worse_pass():
    grid = dict(systems.FULL["grid"])
    rates = [90 * f for f in grid["factors"]]
    # five systems, the weakest at 60 requests/s; ~230 s for both passes
    n = orchestration.grid_requests(rates, [90, 85, 80, 70, 60], grid, 230)
    assert grid["least"] <= n <= grid["most"]
    per_request = sum(max(1 / r, 1 / c) for r in rates for c in (90, 85, 80, 70, 60))
    took = 2 * (n * per_request + grid["overhead_s"] * len(rates) * 5)
    assert took <= 230 + 2 * per_request  # rounded down
    assert orchestration.grid_requests(rates, [90], grid, 10_000) == grid["most"]
    assert orchestration.grid_requests(rates, [90], grid, 1) == grid["least"]
    system = {
        "passes": [
            {"pass": 1, "rows": [{}], "rate_at_p99": 60.0, "rate_exact": True},
            {"pass": 2, "rows": [{}], "rate_at_p99": 55.0, "rate_exact": True},
        ]
    }
    orchestration.worst_of_passes(system, 2)
    assert system["rate_at_p99"] == 55.0 and system["worst_pass"] == 2
    assert system["passes_run"] == system["passes_asked"] == 2
    missing = {"passes": [{"pass": 1, "rows": [], "rate_at_p99": 0.0, "rate_exact": False}]}
    orchestration.worst_of_passes(missing, 2)
    assert missing["rate_at_p99"] == 0.0 and missing["worst_pass"] is None


def test_the_flop_model_is_the_round_3_notes():
    """card-h200-round3.md: Qwen3-0.6B has 440.4M linear weights (0.881 GFLOP a token),
    229,376 FLOPs a causal query-key pair, 0.311 GFLOP an LM-head row; a request of the
    items shape is ~1.78 TFLOP for ours (its query once, each item over it) and for
    multi-item scoring (its item mask), ~2.5 for stock lpm (the query with every item:
    2,730 tokens as measured, 2.75 TFLOP when none of its queries comes from the cache)."""
    model = diagnostics.flop_model(systems.SHAPES["qwen3-0.6b"])
    assert model["linear_weights"] == 440_401_920
    assert model["per_pair"] == 229_376 and model["per_row"] == 2 * 1024 * 151_936
    items = systems.FULL["items"]
    ours = {"new": [300] + [180] * 9, "prefix": [0] + [120] * 9}
    assert diagnostics.forward_flop(ours, model) / 1e12 == pytest.approx(1.78, abs=0.01)
    mis = {"new": [120 + 1 + 10 * 181], "prefix": [0]}
    assert diagnostics.forward_flop(mis, model, items) / 1e12 == pytest.approx(1.80, abs=0.02)
    causal = diagnostics.forward_flop(mis, model)  # without the mask: a causal square
    assert causal > 1.15 * diagnostics.forward_flop(mis, model, items)
    stock = {"new": [300] * 10, "prefix": [0] * 10}  # no query from the cache: 3,000 tokens
    assert diagnostics.forward_flop(stock, model) / 1e12 == pytest.approx(2.75, abs=0.01)
    assert [diagnostics.bucket_of(n) for n in (100, 7680, 8192, 8193, 15448, 20000)] == [
        "<=2k", "6-8k", "6-8k", "8-12k", "12-16k", ">16k"
    ]  # fmt: skip
    assert diagnostics.peak_tflops("NVIDIA H200") == 989.0
    assert diagnostics.peak_tflops("cpu") is None


def test_the_forward_report_matches_sizes_and_reads_device_time(tmp_path):
    """Per engine and part: forwards bucketed by size, device us per computed token from
    device_ms, host ms from step_s, cycles only inside bursts; no device timing on a CPU."""
    import json

    def line(t, new, device_ms=None):
        event = {"event": "forward", "new": new, "prefix": [0] * len(new), "packed": 0,
                 "step_s": 0.02, "t": t}  # fmt: skip
        if device_ms is not None:
            event["device_ms"] = device_ms
        return json.dumps(event)

    (tmp_path / "ours.forwards.jsonl").write_text(
        "\n".join(
            [line(100.0, [4000, 3680], 40.0), line(100.05, [4000, 3680], 40.0),
             line(100.10, [500], 5.0), line(200.0, [300], 3.0)]
        ) + "\n"
    )  # fmt: skip
    (tmp_path / "stock.forwards.jsonl").write_text(line(100.0, [8192]) + "\n")
    results = {
        "items": {
            "systems": {
                "ours": {
                    "bursts": [{"t0": 99.9, "t1": 100.2}],
                    "passes": [{"rows": [{"t0": 199.0, "t1": 201.0}]}],
                },
                "stock": {"bursts": [{"t0": 99.9, "t1": 100.2}], "passes": []},
            }
        }
    }
    shape = systems.SHAPES["qwen3-0.6b"]
    report = diagnostics.forward_report(results, tmp_path, shape, systems.FULL["items"], 989.0)
    ours = report["engines"]["ours"]["items"]
    big = next(b for b in ours["buckets"] if b["bucket"] == "6-8k")
    assert big["forwards"] == 2 and big["device_us_per_token"] == pytest.approx(40e3 / 7680)
    assert big["cycle_ms_p50"] == pytest.approx(50.0) and big["host_ms_p50"] == pytest.approx(20)
    small = next(b for b in ours["buckets"] if b["bucket"] == "<=2k")
    assert small["forwards"] == 2 and small["cycles"] == 0  # the rate's gap is no cycle
    assert ours["device_timing"] and ours["roofline"]["tflops_device"] > 0
    assert ours["roofline"]["pct_peak_device"] == pytest.approx(
        100 * ours["roofline"]["tflops_device"] / 989.0
    )
    stock = report["engines"]["stock"]["items"]
    assert not stock["device_timing"] and stock["buckets"][0]["device_us_per_token"] is None
    text = report_module.markdown(
        {"environment": {}, "model": "m", "command": "c", "sizes": systems.FULL,
         "forwards": report, "errors": {}}
    )  # fmt: skip
    assert "| stock | items | 6-8k (8192) | 1 | 1.0 | no device timing |" in text
    assert "| ours | items | 6-8k (7680) | 2 | 2.0 | 5.21 |" in text


def test_the_profile_summary_names_each_stage_and_ours_excess():
    stages = dict(attention=3.0, merge=1.0, kv_write=0.5, gemm=20.0, norm_rotary_act=4.0,
                  logits=0.5, other=1.0)  # fmt: skip

    def line(tokens, scale=1.0):
        return {"tokens": tokens, "requests": 40, "wall_ms": 40.0, "device_ms": 30.0 * scale,
                "host_ms": 10.0, "stages_ms": {k: v * scale for k, v in stages.items()},
                "kernels": [["gemm_a", 15.0, 56], ["attn", 3.0, 28]]}  # fmt: skip

    entry = {
        "target_tokens": 7680,
        "systems": {
            "stock": {"lines": [line(8192), line(3808, 0.5)]},
            "ours": {"lines": [line(7680, 1.2), line(7680, 1.2), line(7680, 1.3)]},
            "stock-mis": {"lines": [], "note": "no line"},
        },
    }
    diagnostics.summarize_profiles(entry)
    stock = entry["systems"]["stock"]["summary"]
    assert stock["forwards"] == 1 and stock["matched_size"] and stock["tokens"] == 8192
    ours = entry["systems"]["ours"]["summary"]
    assert ours["stages_ms"]["gemm"] == pytest.approx(24.0)
    assert ours["stages_share"]["gemm"] == pytest.approx(20 / 30)
    gemm = next(r for r in entry["comparison"] if r["stage"] == "gemm")
    assert gemm["ours - stock ms"] == pytest.approx(24.0 - 20.0 * 7680 / 8192)
    assert "ours - stock-mis ms" not in gemm  # stock-mis profiled nothing
    text = "\n".join(report_module._profile_section(entry))
    assert "### ours: 3 forwards (matched size), 7680 tokens" in text
    assert "| gemm | 24.000 | 67% |" in text
    assert "- stock-mis: no line (0 lines, 0 bursts)" in text


def test_a_rate_is_held_its_seconds_or_its_requests_whichever_comes_first():
    sizes = systems.FULL
    held = [
        stats.held_requests(rate, sizes["hold_seconds"], sizes["hold_requests"], 24)
        for rate in (0.5, 10.0, 20.0, 40.0)
    ]
    assert held == [24, 150, 300, 300]  # 15 s at 10/s; 300 requests past 20/s


def test_multi_item_scoring_is_skipped_off_cuda_with_its_reason():
    reason = systems.skip_reason("stock-mis", "cpu")
    assert "FlashInfer" in reason and "--enable-mis" in reason and "device is cpu" in reason
    assert systems.skip_reason("stock", "cpu") is None
    assert systems.skip_reason("ours", "cuda") is None
    assert systems.SYSTEM_PARTS["stock-mis"] == ("correctness", "items", "profile")


def test_ours_variants_skip_with_their_reason_where_the_engine_lacks_their_switch(monkeypatch):
    """ours-8k needs the Engine argument jct_batch_tokens, ours-1pass the variable
    PREFILLONLY_CUDA_ONE_PASS: where this tree lacks one, the system is skipped and says
    why (it would be ours)."""
    from prefillonly_sgl import features
    from prefillonly_sgl.machine import environment

    assert systems.system_settings("ours-8k") == {"jct_batch_tokens": 8192}
    assert systems.system_settings("ours-1pass") == {}
    monkeypatch.setattr(features, "OPTIONS", {})
    assert "takes no jct_batch_tokens" in systems.skip_reason("ours-8k", "cuda")
    monkeypatch.setattr(environment, "VARIABLES", ())
    assert "PREFILLONLY_CUDA_ONE_PASS" in systems.skip_reason("ours-1pass", "cuda")
    monkeypatch.setattr(features, "OPTIONS", {"jct_batch_tokens": None})
    monkeypatch.setattr(environment, "VARIABLES", ("PREFILLONLY_CUDA_ONE_PASS",))
    assert systems.skip_reason("ours-8k", "cuda") is None
    assert systems.skip_reason("ours-1pass", "cuda") is None
    assert "CUDA only" in systems.system_note("ours-1pass", "cpu")
    assert systems.system_note("ours-1pass", "cuda") is None


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_systems_settings_on_a_card(tmp_path, arch):
    """What each system's engine is asked on CUDA (resolved here; nothing starts): stock-mis
    as a user of --enable-mis would ask, decode graphs off everywhere, prefill graphs
    SGLang's, ours' buckets stopped at its layer chunk where it runs whole layers."""
    shape = "tiny" if arch == "llama" else "tiny-qwen3"
    folder = model.build_model(shape, tmp_path / arch, "cpu", "float32")
    args = gpu_engine.parse_args(["--tiny", "--device", "cuda"])
    asked = {}
    for system in systems.SYSTEMS:
        config, sglang_args, info = systems.engine_config(system, folder, args, args.sizes, "auto")
        asked[system] = (sglang_args, info, config.settings("hybrid_prefill"))
        if system == "stock":
            assert config.schedule_policy == "lpm" and not config.features
    mis_args, mis_info, _ = asked["stock-mis"]
    assert mis_args["enable_mis"] is True and mis_args["attention_backend"] == "flashinfer"
    assert "turns CUDA graphs off" in mis_info["prefill"]
    stock_args, stock_info, _ = asked["stock"]
    assert "enable_mis" not in stock_args
    assert "cuda_graph_backend_prefill" not in stock_args  # SGLang's default: breakable
    assert stock_info["prefill"].startswith("breakable")
    for sglang_args, info, _ in asked.values():
        assert sglang_args["cuda_graph_backend_decode"] == "disabled"
        assert sglang_args["sleep_on_idle"] is True
        assert info["decode"].startswith("disabled: a scoring request never decodes")
    ours_args, ours_info, hybrid = asked["ours"]
    # ours' prefill graphs are stock's: hybrid prefilling chunks only forwards longer
    # than stock's largest batch (its bucket cap only with an explicit whole_up_to)
    assert hybrid is not None and hybrid.whole_up_to is None
    assert "cuda_graph_max_bs_prefill" not in ours_args
    assert "as stock's" in ours_info["prefill"]
    _, off, _ = systems.engine_config("ours", folder, args, args.sizes, "off")
    assert "cuda_graph_max_bs_prefill" not in off
    assert off["cuda_graph_backend_prefill"] == "disabled"


def test_the_multi_item_reference_is_the_sequence_sglang_scores(tmp_path, monkeypatch):
    """query, delimiter, item at SGLang's MIS positions (the delimiter at the query's last
    position, the item after the query as if the delimiter were not there)."""
    from sglang.srt.constants import MIS_DELIMITER_TOKEN_ID

    ids, positions = model.mis_prompt([5, 6, 7], [8, 9])
    assert ids == [5, 6, 7, MIS_DELIMITER_TOKEN_ID, 8, 9]
    assert positions == [0, 1, 2, 2, 3, 4]
    # a forward of it (the delimiter must be inside the model's vocabulary)
    shape = {**systems.SHAPES["tiny"], "vocab_size": MIS_DELIMITER_TOKEN_ID + 16}
    monkeypatch.setitem(systems.SHAPES, "tiny-vocab", shape)
    folder = model.build_model("tiny-vocab", tmp_path / "m", "cpu", "float32")
    cases = [("cold", [5, 6, 7], [8, 9])]
    plain = model.reference_logprobs(folder, cases, [1, 2], "cpu")
    mis = model.reference_logprobs(folder, cases, [1, 2], "cpu", mis=True)
    assert len(mis["cold"]) == 2 and all(v < 0 for v in mis["cold"])
    assert mis["cold"] != plain["cold"]  # the delimiter is attended


def test_the_workloads_have_the_shapes_they_claim():
    sizes = systems.FULL
    calls = workloads.items_calls(sizes, 400, [1, 2], n=3, seed=0)
    assert [len(c.query) for c in calls] == [120] * 3
    assert all(len(c.items) == 10 and {len(i) for i in c.items} == {180} for c in calls)
    assert len({tuple(c.query) for c in calls}) == 3  # no prefix shared across requests
    rec = workloads.recommendation_calls(sizes, 400, [1, 2], n=200, seed=1)
    profiles = {tuple(c.query) for c in rec}
    assert 1 < len(profiles) <= sizes["rec"]["users"]  # users come back
    assert all(1024 <= len(p) <= 2048 for p in profiles)
    assert all(len(c.items) == 8 and {len(i) for i in c.items} == {150} for c in rec)
    # the same users in every run of the script (a second call, another seed)
    again = workloads.recommendation_calls(sizes, 400, [1, 2], n=50, seed=2)
    assert {tuple(c.query) for c in again} <= _all_profiles(sizes)
    assert {tuple(c.query) for c in again} & profiles
    ids = workloads.random_ids(random.Random(0), 1000, 7)
    assert min(ids) >= 1 and max(ids) < 7


def _all_profiles(sizes) -> set:
    found = {tuple(p) for p in workloads.user_profiles(sizes, 400)}
    assert len(found) == sizes["rec"]["users"]
    return found


def test_the_warm_ups_are_each_shape_without_the_measured_requests():
    """A burst, a second burst and a single request of each load part's shape; the
    recommendation's with users of their own (a miss, then hits), so that the warm-up
    caches none of the measured profiles."""
    sizes, n = systems.FULL, systems.FULL["warmup_requests"]
    ctx = {"sizes": sizes, "vocab": 400, "labels": [1, 2]}
    for part in systems.LOAD_PARTS:
        passes = workloads.warmup_passes(part, sizes, 400, [1, 2])
        assert [len(p) for p in passes] == [n, n, 1]
        measured = parts.part_calls(part, ctx)(4, 5)
        item_shapes = {(len(c.items), len(c.items[0])) for c in measured}
        for calls in passes:
            assert {(len(c.items), len(c.items[0])) for c in calls} == item_shapes
    items = workloads.warmup_passes("items", sizes, 400, [1, 2])
    queries = {tuple(c.query) for calls in items for c in calls}
    assert len(queries) == 2 * n + 1 and {len(q) for q in queries} == {120}
    measured = workloads.items_calls(sizes, 400, [1], 50, 1)
    assert not queries & {tuple(c.query) for c in measured}
    rec = workloads.warmup_passes("recommendation", sizes, 400, [1, 2])
    assert [tuple(c.query) for c in rec[0]] == [tuple(c.query) for c in rec[1]]  # hits
    assert len({tuple(c.query) for c in rec[0]}) == n
    assert not {tuple(c.query) for c in rec[0]} & _all_profiles(sizes)


def test_the_report_shows_each_part_its_ratio_and_failures():
    rows = [
        {
            "rate": 1.0,
            "completed": 4,
            "requests": 4,
            "p50": 0.1,
            "p99": 0.2,
            "cache_hit_share": 0.5,
        },
        {
            "rate": 2.0,
            "completed": 4,
            "requests": 4,
            "p50": 0.2,
            "p99": 0.9,
            "cache_hit_share": 0.5,
        },
    ]
    off = systems.DECODE_GRAPHS_OFF
    results = {
        "environment": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
        "model": "qwen3-0.6b",
        "command": "benchmarks/gpu_engine.py",
        "sizes": systems.FULL,
        "correctness": {
            "reference": {},
            "rows": [
                {
                    "system": "ours",
                    "case": "cold",
                    "tokens": 72,
                    "cached_tokens": 0,
                    "max_abs_logprob_diff": 0.0148,
                },
                {
                    "system": "ours",
                    "case": "packed item 1",
                    "tokens": 324,
                    "cached_tokens": 0,
                    "forwards": 1,
                    "items_in_call": 4,
                    "max_abs_logprob_diff": 0.0201,
                },
                {
                    "system": "stock-mis",
                    "case": "cold",
                    "tokens": 72,
                    "cached_tokens": 0,
                    "max_abs_logprob_diff": 0.0151,
                    "vs_query_item": 0.75,
                },
            ],
        },
        "graphs": {
            "stock": {"prefill": "breakable (SGLang 0.5.23's default on CUDA)", "decode": off},
            "ours": {"prefill": "breakable, buckets up to 2048 tokens", "decode": off},
        },
        "resolved": {"stock": {"prefill_graphs": "breakable (buckets up to 8192)"}},
        "part_seconds": {"stock start": 41.25},
        "warmup": {"stock": {"items": {"seconds": 12.5}, "recommendation": {"seconds": 3.0}}},
        "skipped": {"stock-mis": "needs FlashInfer"},
        "items": {
            "p99_bound_s": 0.5,
            "capacity_measured_on": "stock",
            "burst_capacity_per_s": 24.5,
            "systems": {
                "stock": {"rows": rows, "rate_at_p99": 1.5, "rate_exact": True,
                          "burst": {"requests_per_s": 24.5, "input_tokens_per_s": 73500.0,
                                    "distinct_tokens_per_s": 47040.0, "completed": 48,
                                    "requests": 48}},
                "stock-mis": {"rows": rows, "rate_at_p99": 2.0, "rate_exact": True},
                "ours": {"rows": rows, "rate_at_p99": 3.0, "rate_exact": False,
                         "rates_not_run": [4.0]},
            },
        },
        "long": {"tokens": 32768, "systems": {"ours": {"seconds": 1.5, "forwards": 16,
                                                       "peak_above_resident_mib": 700.0}}},
        "errors": {"ours recommendation": "Traceback ...\nValueError: boom"},
        "engines": {"ours": {"features": ["jct_scheduler", "prefill_kv"],
                             "prefill_only_kv_active": True,
                             "jct_model": {"source": "card estimate: NVIDIA H200 as H200"},
                             "start_warnings": []}},
        "graph_check": {"tolerance": 0.1, "stock": {"max_diff": 0.002, "case": "cold"},
                        "decision": "prefill graphs on: each checked system answered the same"},
    }  # fmt: skip
    text = report_module.markdown(results)
    assert "# The engine on NVIDIA H100 80GB HBM3" in text
    assert "| ours | cold | 72 | 0 |  | 1.48e-02 |" in text
    assert "| ours | packed item 1 | 324 | 0 | 1 (4) | 2.01e-02 |" in text
    assert "| stock-mis | cold | 72 | 0 |  | 1.51e-02 | 7.50e-01 |" in text
    assert "| stock | 24.50 | 73500 | 47040 | 48/48 |" in text  # saturation, tokens/s
    assert "| ours | jct_scheduler, prefill_kv | active | card estimate: NVIDIA H200" in text
    assert "- stock: max |logprob diff| on/off 2.00e-03 (cold)" in text
    assert "- decision: prefill graphs on" in text
    assert "- stock: 15.0 items/s at the bound" in text  # 10 items per request
    assert "- ours: 30.0 items/s at the bound (a bound)" in text
    assert "(rates not run, the deadline: [4.0])" in text
    assert "- ours / stock: 2.00x" in text and "- ours / stock-mis: 1.50x" in text
    assert "- ours / stock's best (stock-mis): 1.50x" in text
    assert "| stock | 1.00 | 0.0 | 4/4 | 0.100 | 0.200 | 50% |" in text  # held s, done
    assert (
        "| stock | 41.2 | breakable (SGLang 0.5.23's default on CUDA) | breakable (buckets up "
        "to 8192) | items 12.5, recommendation 3.0 |" in text
    )
    assert "Decode CUDA graphs: disabled: a scoring request never decodes" in text
    assert "- stock-mis: skipped: needs FlashInfer" in text
    assert "| ours | 1.50 | 16 | 700 |" in text
    assert "## ours recommendation: failed" in text and "ValueError: boom" in text


def test_a_hung_child_is_killed_with_its_own_children(tmp_path):
    """A child past its time is killed with the processes it started (an engine's
    workers hold the card); one that ends reports its code."""
    import subprocess
    import time

    pid_file = tmp_path / "grandchild"
    hang = (
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
        f"open({str(pid_file)!r}, 'w').write(str(g.pid)); time.sleep(600)"
    )
    code, ended = orchestration.run_in_group([sys.executable, "-c", hang], limit=3)
    assert code is None and "ran past 3 s and was killed" in ended
    grandchild = int(pid_file.read_text())
    deadline = 50
    while deadline and subprocess.run(["kill", "-0", str(grandchild)]).returncode == 0:
        deadline -= 1
        time.sleep(0.1)
    assert deadline, f"the grandchild {grandchild} outlived the kill"
    code, ended = orchestration.run_in_group([sys.executable, "-c", "raise SystemExit(3)"], 30)
    assert code == 3 and "ended with code 3" in ended


def _row(system, logprobs=(-1.0, -2.0)):
    return {"system": system, "case": "cold", "tokens": 9, "cached_tokens": 0,
            "max_abs_logprob_diff": 1e-7, "logprobs": list(logprobs)}  # fmt: skip


class _FakeChild:
    """A system's process as the parent sees it, scripted: which engines fail to start
    (system, graphs), which answer differently (labels), and a turn's result (each
    system's items capacity from CAPACITY)."""

    failing: set = set()
    different: set = set()
    turns: list = []
    started: list = []
    CAPACITY = {"stock": 60.0, "ours": 80.0, "stock-mis": 90.0, "ours-8k": 70.0}

    def __init__(self, args, model, system, parts, turns, graphs, label=None, fused_ops=None):
        self.system, self.parts, self.graphs = system, parts, graphs
        self.label = label or system
        self.fused_ops = fused_ops or args.fused_ops
        self.failed = (system, graphs) in self.failing
        self.started.append((self.label, graphs))

    def wait_ready(self, until):
        return "failed" if self.failed else "ready"

    def status(self):
        if self.failed:
            return {"phase": "failed", "report": {"errors": {f"{self.label} start": "boom"}}}
        logprobs = (-1.5, -2.0) if self.label in self.different else (-1.0, -2.0)
        report = {
            "start_s": 1.0,
            "graphs": {"prefill": self.graphs, "decode": "disabled"},
            "warmup": {p: {"seconds": 0.5} for p in self.parts if p in systems.LOAD_PARTS},
            "correctness_rows": (
                [_row(self.label, logprobs)] if "correctness" in self.parts else []
            ),
            "engine": {"features": [], "start_warnings": []},
            "errors": {},
        }
        return {"phase": "ready", "report": report}

    def run_turn(self, turn, hard_end):
        part, phase = turn["part"], turn.get("phase")
        self.turns.append((self.label, part if phase is None else f"{part} {phase}",
                           turn.get("rates")))  # fmt: skip
        if part == parts.LATE_CORRECTNESS:
            return {"part": part, "rows": []}
        if part == "profile":
            return {"part": part, "armed": 3, "bursts": 1, "windows": [], "lines": []}
        if phase == "burst":
            capacity = self.CAPACITY.get(self.system, 50.0)
            burst = {"requests_per_s": capacity, "input_tokens_per_s": 1.0,
                     "distinct_tokens_per_s": 1.0, "completed": 48, "requests": 48}  # fmt: skip
            return {"part": part, "phase": phase, "bursts": [burst, burst], "capacity": capacity}
        if phase == "grid":
            rows = [_rate_row(r, 0.1) for r in turn["rates"]]
            rate = self.CAPACITY.get(self.system, 50.0) * (0.9 if turn["pass"] == 2 else 1.0)
            return {"part": part, "phase": phase, "pass": turn["pass"], "rows": rows,
                    "rate_at_p99": rate, "rate_exact": True, "rates_not_run": [],
                    "rates_skipped": []}  # fmt: skip
        rates = turn.get("rates")
        out = {"part": part, "entry": {"rows": [], "rate_at_p99": 1.0, "rate_exact": True}}
        if rates is None:
            out["capacity"] = {"capacity_measured_on": self.system, "rates": [len(part), 9]}
        return out

    def alive(self):
        return True

    def request_exit(self):
        pass

    def finish(self, limit):
        return "the process ended with code 0"

    def kill(self):
        pass


def _rate_row(rate, p99):
    return {"rate": rate, "held_s": 1.0, "completed": 4, "requests": 4, "p50": 0.05,
            "p99": p99, "cache_hit_share": 0.0}  # fmt: skip


SYSTEM_PARTS = [
    ("stock", ["correctness", "items", "recommendation", "profile"]),
    ("ours", ["correctness", "items", "recommendation", "profile"]),
    ("stock-mis", ["correctness", "items", "profile"]),
]


def _fake_run(tmp_path, monkeypatch, failing=(), different=(), argv=("--device", "cuda")):
    import time

    monkeypatch.setattr(orchestration, "Child", _FakeChild)
    monkeypatch.setattr(orchestration, "environment", lambda device: {"device": device})
    monkeypatch.setattr(_FakeChild, "failing", set(failing))
    monkeypatch.setattr(_FakeChild, "different", set(different))
    monkeypatch.setattr(_FakeChild, "turns", [])
    monkeypatch.setattr(_FakeChild, "started", [])
    args = gpu_engine.parse_args([*argv, "--work", str(tmp_path)])
    args.argv, args.ends_at = [], time.time() + 600
    run = orchestration.ModelRun(args, "tiny", tmp_path / "out", 0.0, args.ends_at, lambda m: None)
    run.engines(SYSTEM_PARTS)
    return run


def test_the_parent_runs_the_items_grid_first_then_recommendation_profile_and_late_cases(
    tmp_path, monkeypatch
):
    """Items first: every system's bursts, then the grid from the best capacity
    (stock-mis' 90/s), pass 1 on every system, then pass 2; then recommendation (stock's
    burst sets its rates), then the fused-ops A/B engines' bursts, the profile on every
    measured engine, then correctness's late cases. Each checked system starts a second
    engine with prefill graphs off; they answered alike, so the graph engines are
    measured; ours' graph engine failed to start, so its second engine is measured."""
    run = _fake_run(
        tmp_path,
        monkeypatch,
        failing={("ours", "auto")},
        argv=("--device", "cuda", "--graphs-check", "--fused-ops-ab", "stock"),
    )
    grid = [round(90.0 * f, 3) for f in systems.FULL["grid"]["factors"]]
    rec = [len("recommendation"), 9]
    late = parts.LATE_CORRECTNESS
    measured = ["stock", "ours-nographs", "stock-mis"]
    assert _FakeChild.turns == [
        *[(s, "items burst", None) for s in measured],
        *[(s, "items grid", grid) for s in measured],
        *[(s, "items grid", grid) for s in measured],
        ("stock", "recommendation", None),
        ("ours-nographs", "recommendation", rec),
        ("stock-compile", "items burst", None),
        *[(s, "profile", None) for s in [*measured, "stock-compile"]],
        ("stock", late, None),
        ("ours-nographs", late, None),
        ("stock-mis", late, None),
    ]
    assert _FakeChild.started == [
        ("stock", "auto"), ("ours", "auto"), ("stock-mis", "auto"),
        ("stock-nographs", "off"), ("ours-nographs", "off"), ("stock-compile", "auto"),
    ]  # fmt: skip
    results = run.results
    assert "retried_without_graphs" not in results
    assert results["errors"] == {"ours start": "boom"}
    check = results["graph_check"]
    assert check["stock"]["max_diff"] == 0.0 and "did not start" in check["ours"]["note"]
    assert check["decision"].startswith("prefill graphs on")
    items = results["items"]
    assert set(items["systems"]) == {"stock", "ours-nographs", "stock-mis", "stock-compile"}
    assert items["capacity_measured_on"] == "stock-mis" and items["rates"] == grid
    assert items["grid"]["passes"] == 2
    assert systems.FULL["grid"]["least"] <= items["grid"]["requests_per_rate"]
    stock = items["systems"]["stock"]
    assert [p["pass"] for p in stock["passes"]] == [1, 2]
    assert stock["rate_at_p99"] == pytest.approx(54.0) and stock["worst_pass"] == 2
    assert "passes" in items["systems"]["stock-compile"]  # bursts only
    assert items["systems"]["stock-compile"]["passes"] == []
    assert items["systems"]["stock-compile"]["fused_ops"] == "compile"
    assert items["systems"]["stock-compile"]["bursts_only"]
    assert set(results["profile"]["systems"]) == {*measured, "stock-compile"}
    assert [r["system"] for r in results["correctness"]["rows"]] == [
        "stock", "stock-mis", "stock-nographs", "ours-nographs", "stock-compile"
    ]  # fmt: skip
    assert set(results["engines"]) == {
        "stock", "stock-mis", "stock-nographs", "ours-nographs", "stock-compile"
    }  # fmt: skip
    text = (tmp_path / "out" / "results.md").read_text()
    assert "| stock | 60.00 (60.0 / 60.0) | 600 | 540 | **540** |" in text
    assert "| stock-compile | 60.00 (60.0 / 60.0) |  |  | bursts only (fused-ops A/B) |" in text
    assert "- ours-nographs / stock's best (stock-mis): 0.89x" in text
    assert "- fused-ops A/B: stock-compile (fused ops compile) / stock (torch): saturation" in text


def test_answers_that_differ_with_graphs_put_both_systems_on_their_second_engines(
    tmp_path, monkeypatch
):
    run = _fake_run(
        tmp_path, monkeypatch, different={"ours"}, argv=("--device", "cuda", "--graphs-check")
    )
    measured = {label for label, part, _ in _FakeChild.turns if part == "items burst"}
    assert measured == {"stock-nographs", "ours-nographs", "stock-mis"}
    check = run.results["graph_check"]
    assert check["ours"]["max_diff"] == 0.5 and check["stock"]["max_diff"] == 0.0
    assert "prefill graphs off for stock, ours: ours answered differently" in check["decision"]


def test_without_the_graph_check_a_failed_start_is_retried_without_graphs(tmp_path, monkeypatch):
    """--no-graphs-check: no second engines; ours' engine failed with graphs, so it is
    started again alone without them, with the rates stock set; past the deadline
    nothing starts."""
    import time

    run = _fake_run(
        tmp_path,
        monkeypatch,
        failing={("ours", "auto")},
        argv=("--device", "cuda", "--no-graphs-check"),
    )
    assert _FakeChild.started == [
        ("stock", "auto"), ("ours", "auto"), ("stock-mis", "auto"), ("ours", "off")
    ]  # fmt: skip
    assert run.results["retried_without_graphs"] == ["ours"]
    assert "graph_check" not in run.results
    assert ("ours", "recommendation", [len("recommendation"), 9]) in _FakeChild.turns
    assert ("ours", "items burst", None) in _FakeChild.turns  # its own grid, alone
    # past the model's deadline: no engine starts, and the results say so
    monkeypatch.setattr(_FakeChild, "started", [])
    late = orchestration.ModelRun(run.args, "tiny", tmp_path / "late", 0.0, time.time(), print)
    late.engines([("stock", ["items"])])
    assert _FakeChild.started == []
    assert late.results["errors"] == {"stock items": "not started: past the deadline"}


def test_a_turn_reserves_what_its_rates_need():
    """The first system's turn reserves one hold; later ones their burst and first rate
    at the rates set (300 requests at 50/s: 6 s, not the 15 s hold)."""
    sizes = dict(systems.FULL)
    assert orchestration.turn_seconds(sizes, None) == sizes["hold_seconds"] + sizes["drain_seconds"]
    need = orchestration.turn_seconds(sizes, [50.0, 93.75])  # capacity 62.5/s
    assert need == pytest.approx(48 / 62.5 + 4 + 300 / 50 + 4)


def test_the_correctness_calls_put_the_packed_items_in_one_call_and_the_long_case_last():
    cases = [("cold", [1], [2]), ("longer than a batch", [3], [4])]
    cases += [(f"{parts.PACKED} {k}", [5] * 80, [k]) for k in (1, 2, 3)]
    early = parts.correctness_calls(cases, late=False)
    assert [[c[0] for c in call] for call in early] == [
        ["cold"], ["packed item 1", "packed item 2", "packed item 3"]
    ]  # fmt: skip
    assert parts.correctness_calls(cases, late=True) == [[cases[1]]]
    rows = [_row("stock"), _row("stock-nographs", (-1.25, -2.0))]
    assert orchestration.graph_difference(rows, "stock", "stock-nographs") == (0.25, "cold")
    assert orchestration.graph_difference(rows, "ours", "ours-nographs") == (None, "")
