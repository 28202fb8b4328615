"""The workload benchmark harness's parts (issue 13): arrivals, statistics, the crossing
rate, whole groups, the servers' command lines. No timing is asserted. Its end-to-end
smoke run (real stock SGLang and prefillonly servers, ~80 s) left the suite to keep it
near 25 minutes; run it by hand: `PYTHONPATH=. .venv/bin/python
benchmarks/workload_curves.py --workload recommendation --smoke --out /tmp/smoke`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from harness import loadgen, stats  # noqa: E402
from harness.loadgen import Outcome  # noqa: E402


def test_poisson_arrivals_have_the_asked_rate_and_a_burst_is_all_at_once():
    times = loadgen.arrival_times(4000, 8.0, seed=1)
    assert times == sorted(times) and abs(len(times) / times[-1] - 8.0) < 0.5
    assert loadgen.arrival_times(3, None, seed=0) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="rate"):
        loadgen.arrival_times(3, 0, seed=0)


def test_statistics_count_unfinished_requests_against_the_bound():
    done = [Outcome(i, 0.1 * i, 1.0 + i, prompt_tokens=100, cached_tokens=50) for i in range(9)]
    row = {"rate": 1.0, **stats.summarize(done + [Outcome(9, 1, None, error="unfinished")], 20)}
    assert row["completed"] == 9 and row["unfinished"] == 1 and row["cache_hit_share"] == 0.5
    assert row["p99"] == 9.0 and row["p50"] == 5.0 and row["mean"] == 5.0
    assert not stats.meets(row, p99_bound=100)  # an unfinished request fails the bound
    ok = {"rate": 0.5, **stats.summarize(done, 20)}
    assert stats.sustained_rate([row, ok], 100) == 0.5
    assert stats.sustained_rate([ok, {**ok, "rate": 2.0}], 8.5) == 0.0  # P99 9 s > 8.5
    assert stats.quantile([3, 1, 2], 0.5) == 2 and stats.rate_grid(1, 8, 4) == [1, 2, 4, 8]


def test_the_crossing_rate_interpolates_between_grid_points_and_says_when_it_is_a_bound():
    def row(rate, p99, completed=10):
        return {"rate": rate, "p99": p99, "completed": completed, "requests": 10}

    # P99 2 s at 1/s and 8 s at 4/s: P99 grows as rate**1, so it is 4 s at 2/s.
    rate, exact = stats.crossing_rate([row(4, 8.0), row(1, 2.0)], 4.0)
    assert exact and rate == pytest.approx(2.0)
    assert stats.crossing_rate([row(1, 2.0), row(4, 3.0)], 4.0) == (4, False)  # met all
    assert stats.crossing_rate([row(1, 5.0), row(4, 8.0)], 4.0) == (0.0, False)  # missed first
    # The next rate left a request unfinished: its P99 is unknown, the last rate met stands.
    assert stats.crossing_rate([row(1, 2.0), row(4, 3.0, completed=9)], 4.0) == (1, False)
    assert stats.run_requests(1.0, 20, 12, 64) == 20 and stats.run_requests(0.1, 20, 12, 64) == 12
    assert stats.run_requests(8.0, 20, 12, 64) == 64


def test_a_short_run_takes_whole_groups_and_the_ideal_order_one_request_first():
    import workload_curves

    assert workload_curves.whole_groups([0, 1, 0, 2, 1, 2], 3, 2) == [0, 1, 2, 4]
    assert workload_curves.whole_groups([0, 1, 0, 2, 1, 2], 99, 2) == list(range(6))
    assert workload_curves.ideal_order([0, 1, 0, 0]) == [[0], [2, 3], [1]]


def test_the_poisson_hit_share_weights_runs_by_their_requests_and_pools_are_reported():
    import workload_curves

    rows = [{"cache_hit_share": 0.5, "requests": 100}, {"cache_hit_share": 0.8, "requests": 50},
            {"cache_hit_share": None, "requests": 10}]  # fmt: skip
    assert workload_curves.poisson_hit_share(rows) == pytest.approx(0.6)
    assert workload_curves.poisson_hit_share([]) is None
    # one budget: ours sizes its own pool from it; stock takes the pool measured for it
    from harness.servers import server_command

    ours = server_command("ours", "m", 1, "bfloat16", ("budget", "1.3GiB", 1573))
    assert ours[ours.index("--memory-budget") + 1] == "1.3GiB" and "--max-total-tokens" not in ours
    lru = server_command("ours-lru", "m", 1, "bfloat16", 4096)
    assert lru[lru.index("--jct-eviction") + 1] == "lru"
    with pytest.raises(ValueError, match="stock SGLang takes a pool in tokens"):
        server_command("stock-lpm", "m", 1, "bfloat16", ("budget", "1.3GiB", 1573))


def test_cache_hit_share_from_counters_and_its_absence():
    assert stats.counter_share((1000.0, 200.0), (3000.0, 1200.0)) == 0.5
    assert stats.counter_share(None, (3000.0, 1200.0)) is None
    assert stats.counter_share((1000.0, 0.0), (1000.0, 0.0)) is None  # nothing served
    assert stats.percent(None) == "n/r" and stats.percent(0.854) == "85%"
