"""Diagnostics: the scheduler's forward log of a child's engine (what a rate's time went
to), what each engine resolved, and the archive of every engine's logs and reports."""

from __future__ import annotations

from pathlib import Path

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
        hybrid = engine.hybrid_settings
        if hybrid is not None:
            facts["hybrid_prefill"] = {k: str(v) for k, v in vars(hybrid).items()}
    except Exception as e:  # an instrument: never the run's end
        facts["error"] = f"{type(e).__name__}: {e}"
    return facts


def save_diagnostics(turns: Path, out: Path) -> None:
    """Everything the engines wrote beside their turns (forward and hybrid logs, each
    engine's status report with its resolved features and correctness answers, each
    turn's result) as one archive beside the results: a device call brings back 8 files."""
    import tarfile

    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "diagnostics.tar.gz", "w:gz") as archive:
        for path in sorted(turns.iterdir()):
            archive.add(path, arcname=f"{turns.name}/{path.name}")
