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
from card_engine import model, orchestration, parts, report, systems, workloads  # noqa: E402
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
    assert args.parts == list(systems.PARTS) and args.overlap
    assert gpu_engine.parse_args([]).dtype == "bfloat16"  # the card's


def test_quick_is_the_first_card_call_and_ends_within_420_s():
    args = gpu_engine.parse_args(["--quick"])
    assert args.models == ["qwen3-0.6b"]
    assert args.parts == ["correctness", "items", "recommendation"]
    assert args.deadline == systems.QUICK_DEADLINE and args.graphs_check
    # the quick call ends by itself within 420 s, the kit's install (~15-20 s) included;
    # a full run's call is 540 s at most
    assert systems.QUICK_DEADLINE + systems.GRACE <= 420 - 20
    assert systems.DEADLINE + systems.GRACE <= 540 - 15
    assert not gpu_engine.parse_args(["--quick", "--device", "cpu"]).graphs_check
    sizes = args.sizes
    assert sizes["hold_seconds"] >= 15 and sizes["hold_requests"] >= 300  # p99s of hundreds
    assert len(sizes["rate_factors"]) == 2
    args = gpu_engine.parse_args(["--quick", "--parts", "items", "--rate-factors", "0.5,1,2"])
    assert args.parts == ["items"] and args.sizes["rate_factors"] == (0.5, 1.0, 2.0)
    assert gpu_engine.parse_args(["--model", "llama-3.2-1b"]).models == ["llama-3.2-1b"]
    # its CPU rehearsal: a tiny model of the same family
    tiny = gpu_engine.parse_args(["--quick", "--tiny", "--device", "cpu"])
    assert [systems.SHAPES[m]["arch"] for m in tiny.models] == ["qwen3"]
    assert tiny.deadline == systems.TINY_DEADLINE < 900  # the kit test's limit on the run


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
    assert systems.SYSTEM_PARTS["stock-mis"] == ("correctness", "items")


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
    text = report.markdown(results)
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
    (system, graphs), which answer differently (labels), and a turn's result."""

    failing: set = set()
    different: set = set()
    turns: list = []
    started: list = []

    def __init__(self, args, model, system, parts, turns, graphs, label=None):
        self.system, self.parts, self.graphs = system, parts, graphs
        self.label = label or system
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

    def run_turn(self, part, rates, ends_at, hard_end):
        self.turns.append((self.label, part, rates))
        if part == parts.LATE_CORRECTNESS:
            return {"part": part, "rows": []}
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


SYSTEM_PARTS = [
    ("stock", ["correctness", "items", "recommendation"]),
    ("ours", ["correctness", "items", "recommendation"]),
    ("stock-mis", ["correctness", "items"]),
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


def test_the_parent_runs_stock_then_ours_then_multi_item_scoring_and_checks_the_graphs(
    tmp_path, monkeypatch
):
    """Items on stock (its burst sets the rates), ours, stock-mis; then recommendation;
    then correctness's late cases (first-time kernel paths) on each measured engine. Each
    checked system starts a second engine with prefill graphs off; they answered alike,
    so the graph engines are measured; ours' graph engine failed to start, so its second
    engine is measured instead of a restart."""
    run = _fake_run(tmp_path, monkeypatch, failing={("ours", "auto")})
    items, rec = [len("items"), 9], [len("recommendation"), 9]
    late = parts.LATE_CORRECTNESS
    assert _FakeChild.turns == [
        ("stock", "items", None),
        ("ours-nographs", "items", items),
        ("stock-mis", "items", items),
        ("stock", "recommendation", None),
        ("ours-nographs", "recommendation", rec),
        ("stock", late, None),
        ("ours-nographs", late, None),
        ("stock-mis", late, None),
    ]
    assert _FakeChild.started == [
        ("stock", "auto"), ("ours", "auto"), ("stock-mis", "auto"),
        ("stock-nographs", "off"), ("ours-nographs", "off"),
    ]  # fmt: skip
    results = run.results
    assert "retried_without_graphs" not in results
    assert results["errors"] == {"ours start": "boom"}
    check = results["graph_check"]
    assert check["stock"]["max_diff"] == 0.0 and "did not start" in check["ours"]["note"]
    assert check["decision"].startswith("prefill graphs on")
    assert set(results["items"]["systems"]) == {"stock", "ours-nographs", "stock-mis"}
    assert results["items"]["capacity_measured_on"] == "stock"
    assert [r["system"] for r in results["correctness"]["rows"]] == [
        "stock", "stock-mis", "stock-nographs", "ours-nographs"
    ]  # fmt: skip
    assert set(results["engines"]) == {"stock", "stock-mis", "stock-nographs", "ours-nographs"}
    assert (tmp_path / "out" / "results.md").exists()


def test_answers_that_differ_with_graphs_put_both_systems_on_their_second_engines(
    tmp_path, monkeypatch
):
    run = _fake_run(tmp_path, monkeypatch, different={"ours"})
    measured = {label for label, part, _ in _FakeChild.turns if part == "items"}
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
    assert ("ours", "items", [len("items"), 9]) in _FakeChild.turns
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
