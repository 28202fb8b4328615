"""Diagnostics: the scheduler's forward log of a child's engine (what a rate's time went
to), the parent's report of every engine's forwards per part (device time per computed
token, host time per forward, cycle, at matched forward sizes; the roofline), the kernel
profile's summary per stage, what each engine resolved, and the archive of every
engine's logs and reports."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# The scheduler's forward log of this process's engine (PREFILLONLY_FORWARD_LOG: one
# line per extend forward, its requests' new tokens and its run_batch's host seconds),
# set by run_system before the engine starts: what a rate's time went to.
_FORWARD_LOG: Path | None = None


def set_forward_log(path: Path) -> None:
    global _FORWARD_LOG
    _FORWARD_LOG = path


def forward_log_on() -> bool:
    return _FORWARD_LOG is not None


def forwards() -> list[dict]:
    if _FORWARD_LOG is None or not _FORWARD_LOG.exists():
        return []
    from prefillonly_sgl.hooking.events import read_events

    return read_events(_FORWARD_LOG, "forward")


def forward_summary(forwards: list[dict]) -> dict:
    """How many extend forwards, their computed tokens and requests (means), the share of
    their requests that were followers packed behind a leader, and the scheduler's
    run_batch seconds (p50, ms; on CUDA the launch and any wait on the device, not the
    device time alone)."""
    if not forwards:
        return {
            "count": 0,
            "tokens_mean": 0.0,
            "requests_mean": 0.0,
            "packed_share": 0.0,
            "step_ms_p50": 0.0,
        }
    steps = sorted(f.get("step_s", 0.0) for f in forwards)
    requests = sum(len(f["new"]) for f in forwards)
    return {
        "count": len(forwards),
        "tokens_mean": sum(sum(f["new"]) for f in forwards) / len(forwards),
        "requests_mean": requests / len(forwards),
        "packed_share": sum(f.get("packed", 0) for f in forwards) / max(1, requests),
        "step_ms_p50": steps[len(steps) // 2] * 1e3,
    }


def engine_facts(engine, start_warnings: list[str]) -> dict:
    """What an engine resolved, for the results: its features, whether prefill-only KV
    is active in its scheduler (and why not), what its model's family switched off, the
    JCT scheduler's job-time model (and where it came from), hybrid prefilling's
    settings, and the warnings its start raised."""
    facts: dict = {"features": list(engine.features), "start_warnings": start_warnings}
    try:
        facts["prefill_only_kv_active"] = bool(engine.prefill_only_kv_active)
        facts["features_off"] = dict(engine.config.features_off)
        jct = engine.jct_settings
        if jct is not None:
            facts["jct_model"] = {**jct.model.coefficients(), "source": jct.model.source}
            facts["jct_settings"] = _plain(jct, skip=("model",))
        hybrid = engine.hybrid_settings
        if hybrid is not None:
            facts["hybrid_prefill"] = {k: str(v) for k, v in vars(hybrid).items()}
    except Exception as e:  # an instrument: never the run's end
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts


def _plain(settings, skip=()) -> dict:
    """A settings object's fields as text (its batch token budget, for ours' variants)."""
    try:
        fields = vars(settings)
    except TypeError:  # slots
        fields = {k: getattr(settings, k) for k in getattr(settings, "__slots__", ())}
    return {k: str(v) for k, v in fields.items() if k not in skip}


def save_diagnostics(turns: Path, out: Path, side: Path | None = None) -> None:
    """Everything the engines wrote beside their turns (forward, hybrid and kernel-profile
    logs, each engine's status report with its resolved features and correctness answers,
    each turn's result) and the card checks' logs (side: their folder; not their models)
    as one archive beside the results: a device call brings back 8 files."""
    import tarfile

    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "diagnostics.tar.gz", "w:gz") as archive:
        for path in sorted(turns.iterdir()):
            archive.add(path, arcname=f"{turns.name}/{path.name}")
        if side is not None and side.exists():
            for path in sorted(side.rglob("*")):
                relative = path.relative_to(side)
                if path.is_file() and "work" not in relative.parts:
                    archive.add(path, arcname=f"side/{relative}")


# ---------------------------------------------------------------- forwards per part


# Forwards bucketed by their computed (new) tokens: (upper bound inclusive, label); the
# systems' forwards compared at matched sizes (ours' 7,680-token forward beside stock's
# 8,192 in "6-8k").
BUCKETS = (
    (2048, "<=2k"),
    (4096, "2-4k"),
    (6144, "4-6k"),
    (8192, "6-8k"),
    (12288, "8-12k"),
    (16384, "12-16k"),
    (None, ">16k"),
)


def bucket_of(tokens: int) -> str:
    for bound, label in BUCKETS:
        if bound is None or tokens <= bound:
            return label
    return BUCKETS[-1][1]


def flop_model(shape: dict) -> dict:
    """FLOPs of the model (card-h200-round3.md's model): 2 x the linear layers' weights
    per computed token, 4 x heads x head_dim x layers per causal query-key pair
    (QK^T and PV), 2 x hidden x vocab per scored row (the LM head); norms, rotary and the
    activation left out."""
    h, heads, kv = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    d, layers = shape["head_dim"], shape["num_hidden_layers"]
    per_layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * shape["intermediate_size"]
    return {
        "linear_weights": layers * per_layer,
        "per_token": 2 * layers * per_layer,
        "per_pair": 4 * heads * d * layers,
        "per_row": 2 * h * shape["vocab_size"],
    }


def forward_flop(forward: dict, model: dict, mis: dict | None = None) -> float:
    """One forward's FLOPs: its computed tokens, each request's causal pairs over its
    cached prefix and itself, one scored row per request. mis (multi-item scoring's
    items shape: query, item, per_request): a request of exactly `query <d> item <d> ...`
    counts the item mask's pairs (the query causal, each item with its delimiter over the
    query and causally over itself) and one row per item, not a causal square."""
    tokens = sum(forward["new"])
    pairs, rows = 0.0, 0
    prefixes = forward.get("prefix") or [0] * len(forward["new"])
    for p, n in zip(prefixes, forward["new"], strict=False):
        if mis is not None and p == 0:
            q, item, k = mis["query"], mis["item"], mis["per_request"]
            if n == q + 1 + k * (item + 1):
                span = item + 1
                pairs += q * (q + 1) / 2 + k * (span * q + span * (span + 1) / 2)
                rows += k
                continue
        pairs += n * p + n * (n + 1) / 2
        rows += 1
    return model["per_token"] * tokens + model["per_pair"] * pairs + model["per_row"] * rows


def peak_tflops(device_name: str) -> float | None:
    from card_engine.systems import PEAK_BF16_TFLOPS

    for key, peak in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return peak
    return None


def read_forward_log(path: Path) -> list[dict]:
    lines = []
    try:
        text = path.read_text()
    except OSError:
        return lines
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "forward":
            lines.append(event)
    return sorted(lines, key=lambda f: f.get("t", 0.0))


def part_windows(results: dict, label: str) -> dict[str, list[dict]]:
    """Each part's epoch windows of one engine, from the results: bursts (and the
    profile's) as "burst" (the engine saturated: the gap between two forwards' launches
    is a cycle), rates as "rate"."""
    windows: dict[str, list[dict]] = {}
    items = results.get("items", {}).get("systems", {}).get(label, {})
    for burst in items.get("bursts", []):
        windows.setdefault("items", []).append({"kind": "burst", **_window(burst)})
    for grid_pass in items.get("passes", []):
        for row in grid_pass.get("rows", []):
            windows.setdefault("items", []).append({"kind": "rate", **_window(row)})
    rec = results.get("recommendation", {}).get("systems", {}).get(label, {})
    if rec.get("burst"):
        windows.setdefault("recommendation", []).append({"kind": "burst", **_window(rec["burst"])})
    for row in rec.get("rows", []):
        windows.setdefault("recommendation", []).append({"kind": "rate", **_window(row)})
    profile = results.get("profile", {}).get("systems", {}).get(label, {})
    for window in profile.get("windows", []):
        windows.setdefault("profile", []).append({"kind": "burst", **_window(window)})
    return {part: [w for w in ws if w["t0"] is not None] for part, ws in windows.items()}


def _window(entry: dict) -> dict:
    return {"t0": entry.get("t0"), "t1": entry.get("t1")}


def forward_report(
    results: dict, turns: Path, shape: dict, items_shape: dict, peak: float | None
) -> dict:
    """Per engine and part (items, recommendation, profile): its forwards bucketed by
    computed tokens, each bucket's forwards, mean tokens, device us per computed token
    (device_ms, CUDA only: "no device timing" elsewhere), host ms per forward (the
    scheduler's run_batch, p50) and cycle ms (p50 of the gaps between consecutive
    forwards' launches inside a burst); and the roofline: FLOPs (flop_model) per device
    second and per second of burst wall, against the card's dense bf16 peak."""
    model = flop_model(shape)
    report: dict = {"flop_model": model, "peak_tflops": peak, "engines": {}}
    logged = {p.name.split(".forwards.jsonl")[0] for p in turns.glob("*.forwards.jsonl")}
    # the results' order (the engines as they started), then any other
    labels = [x for x in results.get("engines", {}) if x in logged] + sorted(
        logged - set(results.get("engines", {}))
    )
    for label in labels:
        log = read_forward_log(turns / f"{label}.forwards.jsonl")
        mis = items_shape if label.startswith("stock-mis") else None
        for part, windows in part_windows(results, label).items():
            entry = part_forwards(log, windows, model, mis, peak)
            if entry["forwards"]:
                report["engines"].setdefault(label, {})[part] = entry
    return report


def part_forwards(log, windows, model, mis, peak) -> dict:
    chosen, cycles, burst_wall, burst_flop = [], {}, 0.0, 0.0
    for window in windows:
        inside = [f for f in log if window["t0"] - 0.05 <= f.get("t", 0.0) <= window["t1"]]
        chosen += inside
        if window["kind"] != "burst":
            continue
        burst_wall += window["t1"] - window["t0"]
        burst_flop += sum(forward_flop(f, model, mis) for f in inside)
        for a, b in zip(inside, inside[1:], strict=False):
            cycles.setdefault(bucket_of(sum(a["new"])), []).append((b["t"] - a["t"]) * 1e3)
    buckets = []
    for _, label in BUCKETS:
        these = [f for f in chosen if bucket_of(sum(f["new"])) == label]
        if not these:
            continue
        tokens = [sum(f["new"]) for f in these]
        timed = [f for f in these if f.get("device_ms") is not None]
        timed_tokens = sum(sum(f["new"]) for f in timed)
        gaps = cycles.get(label, [])
        buckets.append(
            {
                "bucket": label,
                "forwards": len(these),
                "tokens_mean": statistics.fmean(tokens),
                "requests_mean": statistics.fmean(len(f["new"]) for f in these),
                "device_us_per_token": (
                    sum(f["device_ms"] for f in timed) * 1e3 / timed_tokens
                    if timed and timed_tokens
                    else None
                ),
                "device_ms_p50": (
                    statistics.median(f["device_ms"] for f in timed) if timed else None
                ),
                "host_ms_p50": statistics.median(f.get("step_s", 0.0) for f in these) * 1e3,
                "cycle_ms_p50": statistics.median(gaps) if gaps else None,
                "cycles": len(gaps),
            }
        )
    flop = sum(forward_flop(f, model, mis) for f in chosen)
    timed = [f for f in chosen if f.get("device_ms") is not None]
    device_s = sum(f["device_ms"] for f in timed) / 1e3
    timed_flop = sum(forward_flop(f, model, mis) for f in timed)
    device_tflops = timed_flop / device_s / 1e12 if device_s > 0 else None
    wall_tflops = burst_flop / burst_wall / 1e12 if burst_wall > 0 else None
    return {
        "forwards": len(chosen),
        "device_timing": bool(timed),
        "buckets": buckets,
        "roofline": {
            "tflop": flop / 1e12,
            "device_s": device_s,
            "tflops_device": device_tflops,
            "pct_peak_device": _pct(device_tflops, peak),
            "burst_wall_s": burst_wall,
            "tflops_burst_wall": wall_tflops,
            "pct_peak_burst_wall": _pct(wall_tflops, peak),
        },
    }


def _pct(tflops: float | None, peak: float | None) -> float | None:
    return None if tflops is None or not peak else 100 * tflops / peak


# ---------------------------------------------------------------- the kernel profile


STAGES = ("attention", "merge", "kv_write", "gemm", "norm_rotary_act", "logits", "other")


def summarize_profiles(entry: dict) -> None:
    """Each system's profiled forwards (the scheduler's kernel profile lines) summarized
    in place: the forwards of the matched size (within 25% of the target's tokens; all
    when none is), their median tokens, device, wall and host ms and per stage ms, share
    of the stages' sum and us per computed token; the top kernels. Then per stage each
    system's us per token and ours' (each ours-like engine's) excess over stock and over
    stock-mis, in ms at ours' forward size."""
    target = entry.get("target_tokens") or 0
    for system in entry.get("systems", {}).values():
        every = system.get("lines", [])
        errors = [ln["error"] for ln in every if ln.get("error")]
        if errors:
            system["errors"] = errors[:3]
        lines = [ln for ln in every if isinstance(ln.get("stages_ms"), dict)]
        matched = [ln for ln in lines if target and abs(ln.get("tokens", 0) - target) <= target / 4]
        system["summary"] = _profile_summary(matched or lines, matched_size=bool(matched))
        for line in every:  # the whole lines are in LABEL.kernels.jsonl (diagnostics)
            line["kernels"] = sorted(line.get("kernels", []), key=lambda k: -k[1])[:20]
    summaries = {
        label: s["summary"] for label, s in entry.get("systems", {}).items() if s.get("summary")
    }
    comparison = []
    for stage in STAGES:
        row = {"stage": stage}
        for label, summary in summaries.items():
            row[label] = summary["stages_us_per_token"].get(stage)
        for label, summary in summaries.items():
            if not label.startswith("ours"):
                continue
            for stock in ("stock", "stock-mis"):
                mine, theirs = row.get(label), row.get(stock)
                if mine is not None and theirs is not None:
                    excess_ms = (mine - theirs) * summary["tokens"] / 1e3
                    row[f"{label} - {stock} ms"] = excess_ms
        comparison.append(row)
    if summaries:
        entry["comparison"] = comparison


def _profile_summary(lines: list[dict], matched_size: bool) -> dict | None:
    if not lines:
        return None

    def median(key):
        values = [ln[key] for ln in lines if isinstance(ln.get(key), (int, float))]
        return statistics.median(values) if values else None

    tokens = median("tokens") or 0
    stages = {}
    for stage in STAGES:
        values = [ln.get("stages_ms", {}).get(stage) for ln in lines]
        values = [v for v in values if isinstance(v, (int, float))]
        if values:
            stages[stage] = statistics.median(values)
    for line in lines:  # stages the instrument names beyond these
        for stage in line.get("stages_ms", {}):
            if stage not in stages:
                stages[stage] = statistics.median(
                    ln.get("stages_ms", {}).get(stage, 0.0) for ln in lines
                )
    total = sum(stages.values())
    kernels: dict[str, list[float]] = {}
    for line in lines:
        for name, ms, count in line.get("kernels", []):
            k = kernels.setdefault(name, [0.0, 0])
            k[0] += ms / len(lines)
            k[1] += count / len(lines)
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:12]
    return {
        "forwards": len(lines),
        "matched_size": matched_size,
        "tokens": tokens,
        "requests": median("requests"),
        "device_ms": median("device_ms"),
        "busy_ms": median("busy_ms"),
        "wall_ms": median("wall_ms"),
        "launch_ms": median("launch_ms"),
        "host_ms": median("host_ms"),
        "stages_ms": stages,
        "stages_share": {s: (v / total if total else 0.0) for s, v in stages.items()},
        "stages_us_per_token": {
            s: (v * 1e3 / tokens if tokens else None) for s, v in stages.items()
        },
        "top_kernels": [[name, round(ms, 4), round(count, 1)] for name, (ms, count) in top],
    }
