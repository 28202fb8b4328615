"""A score call's prompts admitted together (plain Python, unit-tested).

SGLang sends a score call's prompts to the scheduler one by one when it tokenizes them
one by one (text that is not turned into token ids first: prompts with images, whose
processor runs per prompt). The scheduler would then start the first prompt alone, and
the next ones, arriving while it runs, in a second forward that cannot yet read what the
first computes: the call's shared prefix (an image) computed twice, its items in two
forwards. Each such prompt carries its call's id and size (prefill_kv/messages.py); a
prompt is held while its call is incomplete and its prompts keep coming (the last one
arrived less than GATHER_S ago), then the call runs as one group: one computes the
prefix, the others packed behind it in the same forward.

    arrivals.observe(rid, call_id, size, now)   # each waiting tagged request, each step
    held = arrivals.held(now)                   # rids to leave out of this step's batch
"""

from __future__ import annotations

from dataclasses import dataclass, field

GATHER_S = 0.05  # a call's next prompt comes within this (its tokenization, ~ms) or never
FORGET_S = 60.0  # a call unseen this long is gone (its prompts admitted or aborted)


@dataclass
class _Call:
    size: int
    seen: set[str] = field(default_factory=set)
    last: float = 0.0


class CallArrivals:
    def __init__(self) -> None:
        self._calls: dict[str, _Call] = {}
        self._waiting: dict[str, str] = {}  # rid -> call id, this step's tagged requests

    def start_step(self) -> None:
        self._waiting = {}

    def observe(self, rid: str, call_id: str, size: int, now: float) -> None:
        call = self._calls.get(call_id)
        if call is None:
            call = self._calls[call_id] = _Call(max(1, int(size)))
        if rid not in call.seen:
            call.seen.add(rid)
            call.last = now
        self._waiting[rid] = call_id

    def held(self, now: float) -> set[str]:
        """This step's waiting requests whose call is still arriving."""
        out = set()
        for rid, call_id in self._waiting.items():
            call = self._calls[call_id]
            if len(call.seen) < call.size and now - call.last < GATHER_S:
                out.add(rid)
        self._forget(now)
        return out

    def _forget(self, now: float) -> None:
        waiting = set(self._waiting.values())
        for call_id in [c for c, call in self._calls.items() if c not in waiting]:
            call = self._calls[call_id]
            if len(call.seen) >= call.size or now - call.last > FORGET_S:
                del self._calls[call_id]
