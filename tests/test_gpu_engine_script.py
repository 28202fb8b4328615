"""benchmarks/gpu_engine.py's plain pieces (no engine): its arguments, workloads and
report. The script itself runs end to end, on the engine kit, in
tests/test_gpu_kit.py (tiny shapes, CPU)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gpu_engine  # noqa: E402


def test_unknown_parts_and_systems_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--parts", "correctness,speed"])
    assert "unknown parts ['speed']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_engine.parse_args(["--systems", "vllm"])
    assert "--systems: choose from stock, ours" in capsys.readouterr().err
    args = gpu_engine.parse_args(["--tiny", "--device", "cpu", "--systems", "ours"])
    assert args.systems == ["ours"] and args.dtype == "float32" and args.model == "tiny"
    assert gpu_engine.parse_args([]).dtype == "bfloat16"  # the card's


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
    assert {tuple(c.query) for c in again} <= set(profiles) | _all_profiles(sizes)
    assert {tuple(c.query) for c in again} & profiles
    ids = gpu_engine.random_ids(random.Random(0), 1000, 7)
    assert min(ids) >= 1 and max(ids) < 7


def _all_profiles(sizes) -> set:
    many = gpu_engine.recommendation_calls(sizes, 400, [1, 2], n=2000, seed=3)
    found = {tuple(c.query) for c in many}
    assert len(found) == sizes["rec"]["users"]
    return found


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
                }
            ],
        },
        "items": {
            "p99_bound_s": 0.5,
            "capacity_measured_on": "stock",
            "burst_capacity_per_s": 24.5,
            "systems": {
                "stock": {"rows": rows, "rate_at_p99": 1.5, "rate_exact": True},
                "ours": {"rows": rows, "rate_at_p99": 3.0, "rate_exact": False},
            },
        },
        "long": {"tokens": 32768, "systems": {"ours": {"seconds": 1.5, "forwards": 16,
                                                       "peak_above_resident_mib": 700.0}}},
        "errors": {"ours recommendation": "Traceback ...\nValueError: boom"},
    }  # fmt: skip
    text = gpu_engine.markdown(results)
    assert "# The engine on NVIDIA H100 80GB HBM3" in text
    assert "| ours | cold | 72 | 0 | 1.48e-02 |" in text
    assert "- stock: 15.0 items/s at the bound" in text  # 10 items per request
    assert "- ours: 30.0 items/s at the bound (a bound)" in text
    assert "- ours / stock: 2.00x" in text
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
