"""Structured debugging events: one JSON object per line, `{"event": "<feature>.<what>",
...fields}`, appended to the file a debugging switch names (PREFILLONLY_ATTENTION_LOG,
PREFILLONLY_SCHEDULER_LOG, PREFILLONLY_HYBRID_LOG). People read them with `jq`; tests
assert on their fields, never on text."""

from __future__ import annotations

import json
from pathlib import Path


def append_event(path: str | Path, event: str, **fields) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, **fields}) + "\n")


def read_events(path: str | Path, event: str | None = None) -> list[dict]:
    """Every event in the file (none if it does not exist), or those named ``event``."""
    path = Path(path)
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if event is None or e["event"] == event]
