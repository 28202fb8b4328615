"""benchmarks/gpu_engine.py's plain pieces (no engine): its arguments, workloads, warm-ups,
the systems' settings on a card (resolved here, nothing started), the multi-item scoring
reference and the report. The script itself runs end to end, on the engine kit, in
tests/test_gpu_kit.py (tiny shapes, CPU)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_engine  # noqa: E402
from harness import stats  # noqa: E402


def test_unknown_parts_and_systems_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--parts", "correctness,speed"])
    assert "unknown parts ['speed']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--systems", "vllm"])
    assert "--systems: choose from stock, stock-mis, ours" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--models", "qwen3-0.6b,gpt-9"])
    assert "unknown models ['gpt-9']" in capsys.readouterr().err
    args = gpu_engine.parse_args(["--tiny", "--device", "cpu", "--systems", "ours"])
    assert args.systems == ["ours"] and args.dtype == "float32" and args.models == ["tiny"]
    assert args.parts == list(gpu_engine.PARTS) and args.overlap
    assert gpu_engine.parse_args([]).dtype == "bfloat16"  # the card's


def test_quick_is_both_models_on_the_items_shape_in_one_call():
    args = gpu_engine.parse_args(["--quick"])
    assert args.models == ["qwen3-0.6b", "llama-3.2-1b"]
    assert args.parts == ["correctness", "items"] and args.deadline == gpu_engine.DEADLINE
    # a device call is 540 s at most; the kit's install comes before the script's clock
    assert gpu_engine.DEADLINE + gpu_engine.GRACE <= 540 - 15
    sizes = args.sizes
    assert sizes["hold_seconds"] >= 15 and sizes["hold_requests"] >= 300  # p99s of hundreds
    assert len(sizes["rate_factors"]) == 2
    args = gpu_engine.parse_args(["--quick", "--parts", "items", "--rate-factors", "0.5,1,2"])
    assert args.parts == ["items"] and args.sizes["rate_factors"] == (0.5, 1.0, 2.0)
    assert gpu_engine.parse_args(["--model", "llama-3.2-1b"]).models == ["llama-3.2-1b"]
    # its CPU rehearsal: two tiny models of the same families
    tiny = gpu_engine.parse_args(["--quick", "--tiny", "--device", "cpu"])
    assert [gpu_engine.SHAPES[m]["arch"] for m in tiny.models] == ["qwen3", "llama"]
    assert tiny.deadline == gpu_engine.TINY_DEADLINE < 900  # the kit test's limit on the run


def test_a_rate_is_held_its_seconds_or_its_requests_whichever_comes_first():
    sizes = gpu_engine.FULL
    held = [
        stats.held_requests(rate, sizes["hold_seconds"], sizes["hold_requests"], 24)
        for rate in (0.5, 10.0, 20.0, 40.0)
    ]
    assert held == [24, 150, 300, 300]  # 15 s at 10/s; 300 requests past 20/s


def test_multi_item_scoring_is_skipped_off_cuda_with_its_reason():
    reason = gpu_engine.skip_reason("stock-mis", "cpu")
    assert "FlashInfer" in reason and "--enable-mis" in reason and "device is cpu" in reason
    assert gpu_engine.skip_reason("stock", "cpu") is None
    assert gpu_engine.skip_reason("ours", "cuda") is None
    assert gpu_engine.SYSTEM_PARTS["stock-mis"] == ("correctness", "items")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_systems_settings_on_a_card(tmp_path, arch):
    """What each system's engine is asked on CUDA (resolved here; nothing starts): stock-mis
    as a user of --enable-mis would ask, decode graphs off everywhere, prefill graphs
    SGLang's, ours' buckets stopped at its layer chunk where it runs whole layers."""
    shape = "tiny" if arch == "llama" else "tiny-qwen3"
    folder = gpu_engine.build_model(shape, tmp_path / arch, "cpu", "float32")
    args = gpu_engine.parse_args(["--tiny", "--device", "cuda"])
    asked = {}
    for system in gpu_engine.SYSTEMS:
        config, sglang_args, info = gpu_engine.engine_config(
            system, folder, args, args.sizes, "auto"
        )
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
    _, off, _ = gpu_engine.engine_config("ours", folder, args, args.sizes, "off")
    assert "cuda_graph_max_bs_prefill" not in off
    assert off["cuda_graph_backend_prefill"] == "disabled"


def test_the_multi_item_reference_is_the_sequence_sglang_scores(tmp_path, monkeypatch):
    """query, delimiter, item at SGLang's MIS positions (the delimiter at the query's last
    position, the item after the query as if the delimiter were not there)."""
    from sglang.srt.constants import MIS_DELIMITER_TOKEN_ID

    ids, positions = gpu_engine.mis_prompt([5, 6, 7], [8, 9])
    assert ids == [5, 6, 7, MIS_DELIMITER_TOKEN_ID, 8, 9]
    assert positions == [0, 1, 2, 2, 3, 4]
    # a forward of it (the delimiter must be inside the model's vocabulary)
    shape = {**gpu_engine.SHAPES["tiny"], "vocab_size": MIS_DELIMITER_TOKEN_ID + 16}
    monkeypatch.setitem(gpu_engine.SHAPES, "tiny-vocab", shape)
    folder = gpu_engine.build_model("tiny-vocab", tmp_path / "m", "cpu", "float32")
    cases = [("cold", [5, 6, 7], [8, 9])]
    plain = gpu_engine.reference_logprobs(folder, cases, [1, 2], "cpu")
    mis = gpu_engine.reference_logprobs(folder, cases, [1, 2], "cpu", mis=True)
    assert len(mis["cold"]) == 2 and all(v < 0 for v in mis["cold"])
    assert mis["cold"] != plain["cold"]  # the delimiter is attended


def test_the_workloads_have_the_shapes_they_claim():
    sizes = gpu_engine.FULL
    calls = gpu_engine.items_calls(sizes, 400, [1, 2], n=3, seed=0)
    assert [len(c.query) for c in calls] == [120] * 3
    assert all(len(c.items) == 10 and {len(i) for i in c.items} == {180} for c in calls)
    assert len({tuple(c.query) for c in calls}) == 3  # no prefix shared across requests
    rec = gpu_engine.recommendation_calls(sizes, 400, [1, 2], n=200, seed=1)
    profiles = {tuple(c.query) for c in rec}
    assert 1 < len(profiles) <= sizes["rec"]["users"]  # users come back
    assert all(1024 <= len(p) <= 2048 for p in profiles)
    assert all(len(c.items) == 8 and {len(i) for i in c.items} == {150} for c in rec)
    # the same users in every run of the script (a second call, another seed)
    again = gpu_engine.recommendation_calls(sizes, 400, [1, 2], n=50, seed=2)
    assert {tuple(c.query) for c in again} <= _all_profiles(sizes)
    assert {tuple(c.query) for c in again} & profiles
    ids = gpu_engine.random_ids(random.Random(0), 1000, 7)
    assert min(ids) >= 1 and max(ids) < 7


def _all_profiles(sizes) -> set:
    found = {tuple(p) for p in gpu_engine.user_profiles(sizes, 400)}
    assert len(found) == sizes["rec"]["users"]
    return found


def test_the_warm_ups_are_each_shape_without_the_measured_requests():
    """A burst, a second burst and a single request of each load part's shape; the
    recommendation's with users of their own (a miss, then hits), so that the warm-up
    caches none of the measured profiles."""
    sizes, n = gpu_engine.FULL, gpu_engine.FULL["warmup_requests"]
    ctx = {"sizes": sizes, "vocab": 400, "labels": [1, 2]}
    for part in gpu_engine.LOAD_PARTS:
        passes = gpu_engine.warmup_passes(part, sizes, 400, [1, 2])
        assert [len(p) for p in passes] == [n, n, 1]
        measured = gpu_engine.part_calls(part, ctx)(4, 5)
        item_shapes = {(len(c.items), len(c.items[0])) for c in measured}
        for calls in passes:
            assert {(len(c.items), len(c.items[0])) for c in calls} == item_shapes
    items = gpu_engine.warmup_passes("items", sizes, 400, [1, 2])
    queries = {tuple(c.query) for calls in items for c in calls}
    assert len(queries) == 2 * n + 1 and {len(q) for q in queries} == {120}
    measured = gpu_engine.items_calls(sizes, 400, [1], 50, 1)
    assert not queries & {tuple(c.query) for c in measured}
    rec = gpu_engine.warmup_passes("recommendation", sizes, 400, [1, 2])
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
    off = gpu_engine.DECODE_GRAPHS_OFF
    results = {
        "environment": {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3"},
        "model": "qwen3-0.6b",
        "command": "benchmarks/gpu_engine.py",
        "sizes": gpu_engine.FULL,
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
                "stock": {"rows": rows, "rate_at_p99": 1.5, "rate_exact": True},
                "stock-mis": {"rows": rows, "rate_at_p99": 2.0, "rate_exact": True},
                "ours": {"rows": rows, "rate_at_p99": 3.0, "rate_exact": False,
                         "rates_not_run": [4.0]},
            },
        },
        "long": {"tokens": 32768, "systems": {"ours": {"seconds": 1.5, "forwards": 16,
                                                       "peak_above_resident_mib": 700.0}}},
        "errors": {"ours recommendation": "Traceback ...\nValueError: boom"},
    }  # fmt: skip
    text = gpu_engine.markdown(results)
    assert "# The engine on NVIDIA H100 80GB HBM3" in text
    assert "| ours | cold | 72 | 0 | 1.48e-02 |" in text
    assert "| stock-mis | cold | 72 | 0 | 1.51e-02 | 7.50e-01 |" in text
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
    code, ended = gpu_engine.run_in_group([sys.executable, "-c", hang], limit=3)
    assert code is None and "ran past 3 s and was killed" in ended
    grandchild = int(pid_file.read_text())
    deadline = 50
    while deadline and subprocess.run(["kill", "-0", str(grandchild)]).returncode == 0:
        deadline -= 1
        time.sleep(0.1)
    assert deadline, f"the grandchild {grandchild} outlived the kill"
    code, ended = gpu_engine.run_in_group([sys.executable, "-c", "raise SystemExit(3)"], 30)
    assert code == 3 and "ended with code 3" in ended


def _row(system):
    return {"system": system, "case": "cold", "tokens": 9, "cached_tokens": 0,
            "max_abs_logprob_diff": 1e-7}  # fmt: skip


class _FakeChild:
    """A system's process as the parent sees it, scripted: which systems fail to start
    (with which graphs), and a turn's result."""

    failing: set = set()
    turns: list = []
    started: list = []

    def __init__(self, args, model, system, parts, turns, graphs):
        self.system, self.parts, self.graphs = system, parts, graphs
        self.failed = (system, graphs) in self.failing
        self.started.append((system, graphs))

    def wait_ready(self, until):
        return "failed" if self.failed else "ready"

    def status(self):
        if self.failed:
            return {"phase": "failed", "report": {"errors": {f"{self.system} start": "boom"}}}
        report = {
            "start_s": 1.0,
            "graphs": {"prefill": self.graphs, "decode": "disabled"},
            "warmup": {p: {"seconds": 0.5} for p in self.parts if p in gpu_engine.LOAD_PARTS},
            "correctness_rows": [_row(self.system)] if "correctness" in self.parts else [],
            "errors": {},
        }
        return {"phase": "ready", "report": report}

    def run_turn(self, part, rates, ends_at, hard_end):
        self.turns.append((self.system, part, rates))
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


def test_the_parent_runs_parts_system_by_system_and_retries_a_failed_start_without_graphs(
    tmp_path, monkeypatch
):
    """Items on stock (its burst sets the rates), stock-mis, then recommendation; ours'
    engine failed to start with prefill graphs, so it is started again alone without
    them, with the rates stock set; past the deadline nothing starts."""
    import time

    monkeypatch.setattr(gpu_engine, "Child", _FakeChild)
    monkeypatch.setattr(gpu_engine, "environment", lambda device: {"device": device})
    monkeypatch.setattr(_FakeChild, "failing", {("ours", "auto")})
    monkeypatch.setattr(_FakeChild, "turns", [])
    monkeypatch.setattr(_FakeChild, "started", [])
    args = gpu_engine.parse_args(["--device", "cuda", "--work", str(tmp_path)])
    args.argv, args.ends_at = [], time.time() + 600
    run = gpu_engine.ModelRun(args, "tiny", tmp_path / "out", 0.0, args.ends_at, lambda m: None)
    run.engines(
        [
            ("stock", ["correctness", "items", "recommendation"]),
            ("stock-mis", ["correctness", "items"]),
            ("ours", ["items", "recommendation"]),
        ]
    )
    items, rec = [len("items"), 9], [len("recommendation"), 9]
    assert _FakeChild.turns == [
        ("stock", "items", None),
        ("stock-mis", "items", items),
        ("stock", "recommendation", None),
        ("ours", "items", items),
        ("ours", "recommendation", rec),
    ]
    assert _FakeChild.started == [
        ("stock", "auto"), ("stock-mis", "auto"), ("ours", "auto"), ("ours", "off")
    ]  # fmt: skip
    results = run.results
    assert results["retried_without_graphs"] == ["ours"]
    assert results["errors"] == {"ours start": "boom"}
    assert set(results["items"]["systems"]) == {"stock", "stock-mis", "ours"}
    assert results["items"]["capacity_measured_on"] == "stock"
    assert [r["system"] for r in results["correctness"]["rows"]] == ["stock", "stock-mis"]
    assert set(results["warmup"]) == {"stock", "stock-mis", "ours"}
    assert (tmp_path / "out" / "results.md").exists()
    # past the model's deadline: no engine starts, and the results say so
    monkeypatch.setattr(_FakeChild, "started", [])
    late = gpu_engine.ModelRun(args, "tiny", tmp_path / "late", 0.0, time.time(), print)
    late.engines([("stock", ["items"])])
    assert _FakeChild.started == []
    assert late.results["errors"] == {"stock items": "not started: past the deadline"}
