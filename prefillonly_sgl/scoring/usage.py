"""Per-request usage, aggregated from SGLang's per-prompt meta_info (plain Python): one
record; each wire format that reports it has its view (wire/prefillonly.py: score_usage,
score_labels_usage, api_usage).

Shared by the Engine (ScoreResult.cached_tokens) and the server (usage fields, headers,
metrics); sglang_runtime/request_recording.py fills the records. Besides the wire views:

    headers()              x-prefillonly-* response headers, on every guarded path
    write_tokens(k)        what the typed decisions report as cache_write_tokens

SGLang reports, for each prompt it finishes, a meta_info dict with prompt_tokens,
cached_tokens (prefix-cache hits) and, with --enable-metrics, queue_time (seconds waited
in the scheduler queue), forward_entry_time and prefill_finished_time (wall-clock
timestamps). A request with several prompts (a /v1/score batch) sums the token counts;
its queue time is the longest wait of its prompts, and its running time spans from the
first prompt entering a forward batch to the last one finishing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestUsage:
    by_prompt: dict[str, dict] = field(default_factory=dict)  # rid -> latest meta_info

    def add_output(self, out: object) -> None:
        """Records one output of SGLang's generate_request (a dict or a list of dicts).
        Streaming outputs repeat a prompt's meta_info; the latest one wins."""
        for one in out if isinstance(out, list) else [out]:
            meta = one.get("meta_info") if isinstance(one, dict) else None
            if isinstance(meta, dict) and "prompt_tokens" in meta:
                self.by_prompt[str(meta.get("id", len(self.by_prompt)))] = meta

    @property
    def prompts(self) -> int:
        return len(self.by_prompt)

    @property
    def prompt_tokens(self) -> int:
        return sum(int(m.get("prompt_tokens") or 0) for m in self.by_prompt.values())

    @property
    def cached_tokens(self) -> int:
        return sum(int(m.get("cached_tokens") or 0) for m in self.by_prompt.values())

    @property
    def queue_time(self) -> float | None:
        times = [m["queue_time"] for m in self.by_prompt.values() if m.get("queue_time")]
        return max(times) if times else None

    @property
    def running_time(self) -> float | None:
        metas = self.by_prompt.values()
        starts = [m["forward_entry_time"] for m in metas if m.get("forward_entry_time")]
        ends = [m["prefill_finished_time"] for m in metas if m.get("prefill_finished_time")]
        if starts and ends:
            return max(0.0, max(ends) - min(starts))
        return None

    def write_tokens(self, reusable_tokens: int) -> int:
        """Tokens of a shared prefix of ``reusable_tokens`` this request computed (and so
        wrote to the prefix cache): what its least-cached prompt behind the prefix had to
        compute of it (0 when the prefix was already cached)."""
        behind = [
            int(m.get("cached_tokens") or 0)
            for m in self.by_prompt.values()
            if int(m.get("prompt_tokens") or 0) > reusable_tokens
        ]
        return max(0, reusable_tokens - min(behind)) if behind else 0

    def headers(self) -> list[tuple[bytes, bytes]]:
        if not self.by_prompt:
            return []
        values = {
            b"x-prefillonly-prompt-tokens": self.prompt_tokens,
            b"x-prefillonly-cached-tokens": self.cached_tokens,
            b"x-prefillonly-queue-time": self.queue_time,
            b"x-prefillonly-running-time": self.running_time,
        }
        return [
            (name, (f"{v:.6f}" if isinstance(v, float) else str(v)).encode())
            for name, v in values.items()
            if v is not None
        ]


@dataclass
class RequestRecord:
    """What the SGLang side learns about one request (an HTTP request or one score call)
    while it runs; filled by sglang_runtime/request_recording.py.

    A score call inside an HTTP request (a typed endpoint may make several) records into
    a child record: its own usage is the call's, and everything also reaches the parent,
    whose usage and rids (for aborting on disconnect) cover the whole request."""

    path: str
    usage: RequestUsage = field(default_factory=RequestUsage)
    sglang_requests: list[Any] = field(default_factory=list)  # GenerateReqInput objects
    parent: RequestRecord | None = None

    def child(self, path: str) -> RequestRecord:
        return RequestRecord(path=path, parent=self)

    def lineage(self) -> list[RequestRecord]:
        """This record and its parents, innermost first."""
        records, record = [], self
        while record is not None:
            records.append(record)
            record = record.parent
        return records
