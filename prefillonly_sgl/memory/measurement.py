"""The start-up measurement behind a memory budget: one engine with a small pool scores one
prompt of the longest length promised, while the scheduler's memory probe
(sglang_runtime/memory_probe) records what was resident before each forward and the peak
during it. The measurement is saved (like the scheduler's job-time profiles) under
<cache>/memory-profiles/, keyed by everything it depends on, so later starts with the same
settings skip it; delete the file to measure again.

The engine factory is passed in (the Engine passes a stock-sized copy of itself), so this
module imports no engine.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from prefillonly_sgl.machine.device_defaults import resolved_dtype
from prefillonly_sgl.memory.budget import (
    Measurement,
    MemoryPlan,
    kv_bytes_per_token,
    mib,
    plan_pool,
)

FORMAT = 1
# Pool of the calibration engine when the prompt keeps no pool KV (prefill-only KV): its
# reusable prefix only, which the calibration prompt keeps short.
CALIBRATION_POOL = 1024
CALIBRATION_QUERY = 64
# Above a prompt's own tokens when its KV lives in the pool (SGLang keeps a few for itself).
POOL_SLACK = 64


def model_config(model_path: str | Path) -> dict:
    try:
        return json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {model_path}/config.json to plan memory: {e}") from None


def default_max_prompt(config: dict, context_length: int | None) -> int:
    if context_length:
        return int(context_length)
    if not config.get("max_position_embeddings"):
        raise ValueError("the model's context length is unknown: give max_prompt_tokens")
    return int(config["max_position_embeddings"])


def measurement_key(
    model_path,
    device: str,
    dtype: str,
    features,
    chunk_size: int | None,
    max_prompt,
    hybrid_mode: str | None = None,
) -> dict:
    """What a measurement depends on."""
    return {
        "format": FORMAT,
        "model": str(Path(model_path).resolve()),
        "device": device,
        "dtype": dtype,
        "features": sorted(features),
        "hybrid_chunk_size": chunk_size,
        "hybrid_mode": hybrid_mode,
        "max_prompt_tokens": max_prompt,
    }


def measurement_path(key: dict) -> Path:
    from prefillonly_sgl.models.default_model import cache_root

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "memory-profiles" / f"{Path(key['model']).name}-{digest}.json"


def load_measurement(path: Path, key: dict) -> Measurement | None:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if document.get("key") != key:
        return None
    return Measurement(**document["measurement"])


def save_measurement(path: Path, key: dict, measurement: Measurement) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"key": key, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "measurement": measurement.to_dict()}  # fmt: skip
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(document, indent=1))
    partial.replace(path)  # never a half-written file


def read_probe(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(
    start_engine: Callable[[int, Path], object], max_prompt: int, pool_tokens: int, log, exact=True
):
    """Starts an engine with `pool_tokens` of pool and the probe on (`start_engine(pool,
    probe file)`: the file goes to its workers in the runtime configuration), scores a
    short prompt (warm-up), then one of `max_prompt` tokens (exact=False: at most what the
    engine accepts, a few tokens under the context); returns that call's Measurement."""
    with tempfile.TemporaryDirectory(prefix="prefillonly-probe-") as folder:
        probe = Path(folder) / "probe.jsonl"
        engine = start_engine(pool_tokens, probe)
        try:
            limit = engine.limits.scoring_prompt_tokens
            if not exact:
                max_prompt = min(max_prompt, limit)
            if max_prompt > limit:
                raise ValueError(
                    f"max_prompt_tokens={max_prompt:,} is above what this engine accepts "
                    f"({limit:,} tokens: the context length"
                    + ("" if engine.prefill_only_kv_active else " and the KV pool")
                    + ")"
                )
            vocab = engine.limits.vocab_size
            rng = random.Random(0)

            def ids(n):
                return [rng.randrange(vocab // 8, vocab - vocab // 8) for _ in range(n)]

            query = min(CALIBRATION_QUERY, max_prompt // 2)
            engine.score(ids(query), [ids(min(256, max_prompt) - query)], [0, 1])
            warm = len(read_probe(probe))
            log(f"scoring one {max_prompt:,}-token prompt")
            engine.score(ids(query), [ids(max_prompt - query)], [0, 1])
        finally:
            engine.shutdown()
        records = read_probe(probe)[warm:]
    if not records:
        raise RuntimeError(
            "the memory probe recorded no forward of the calibration prompt (is the "
            "prefillonly plugin installed in this environment?)"
        )
    return Measurement(
        prompt_tokens=max_prompt,
        pool_tokens=pool_tokens,
        resident_before=min(r["resident_before"] for r in records),
        peak=max(r["peak"] for r in records),
        device=records[0]["device"],
    )


def plan(
    budget: int,
    start_engine: Callable[[int, Path], object],
    *,
    model_path: str | Path,
    device: str,
    dtype: str,
    features,
    chunk_size: int | None,
    hybrid_mode: str | None = None,
    max_prompt_tokens: int | None = None,
    context_length: int | None = None,
    log: Callable[[str], None] | None = None,
) -> MemoryPlan:
    """The KV pool for `budget` bytes (see budget.py), from a saved measurement of these
    settings or one made now with `start_engine(pool_tokens, probe_file)`."""
    log = log or (lambda msg: print(f"[prefillonly] {msg}", file=sys.stderr, flush=True))
    config = model_config(model_path)
    dtype = resolved_dtype(model_path, dtype)
    kv_bytes = kv_bytes_per_token(config, dtype)
    max_prompt = max_prompt_tokens or default_max_prompt(config, context_length)
    if max_prompt < 1:
        raise ValueError(f"max_prompt_tokens must be a positive number, got {max_prompt}")
    prompt_needs_pool = "prefill_kv" not in features
    # Without a length, the longest prompt the engine accepts (the context, less the few
    # tokens SGLang keeps back), known once the calibration engine runs.
    exact = max_prompt_tokens is not None
    key = measurement_key(
        model_path,
        device,
        dtype,
        features,
        chunk_size,
        max_prompt if exact else f"context:{max_prompt}",
        hybrid_mode,
    )
    path = measurement_path(key)
    measurement = load_measurement(path, key)
    if measurement is None:
        pool = max_prompt + POOL_SLACK if prompt_needs_pool else CALIBRATION_POOL
        what = (
            f"a {max_prompt:,}-token prompt"
            if exact
            else f"the longest prompt the engine accepts (~{max_prompt:,} tokens)"
        )
        log(f"memory budget: measuring the peak memory of {what} (once for these settings; "
            f"saved to {path})")  # fmt: skip
        started = time.perf_counter()
        measurement = measure(start_engine, max_prompt, pool, log, exact)
        save_measurement(path, key, measurement)
        log(
            f"measured in {time.perf_counter() - started:.0f} s: activations "
            f"{mib(measurement.activation)}"
        )
    result = plan_pool(
        budget, measurement, kv_bytes, prompt_needs_pool=prompt_needs_pool, source=str(path)
    )
    log(result.describe())
    return result
