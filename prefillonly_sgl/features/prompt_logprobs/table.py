"""The per-position side table (plain torch): one row per KV pool slot.

A prompt token's echo entry depends only on the tokens up to it: its logprob given the
tokens before it, and the top-k of the distribution it was drawn from (the previous
position's). The slot holding the token's KV in the prefix cache identifies exactly that
past (a radix-tree path), so the entry is kept in the row of that slot, and lives as long
as the slot holds that token: a slot handed out again by the allocator is invalidated
(`invalidate`, called on every allocation), so an entry never outlives its KV.

`valid` sits on the pool's device (invalidating on allocation costs no device sync); the
entries themselves on the CPU, where the scheduler builds its responses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# OpenAI's limit on top_logprobs (and our request checks'): the table's widest row.
MAX_TOP_K = 20


@dataclass
class CachedRows:
    """Entries of consecutive prompt positions, in order (top rows hold k entries each)."""

    logprobs: list[float]
    top_values: list[list[float]]
    top_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.logprobs)


class PositionTable:
    def __init__(self, num_slots: int, device: str | torch.device = "cpu") -> None:
        self.num_slots = num_slots
        self.valid = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.top_k = torch.zeros(num_slots, dtype=torch.int8)  # entries kept in the row
        self.logprob = torch.zeros(num_slots, dtype=torch.float32)
        self.top_values = torch.zeros(num_slots, 0, dtype=torch.float32)
        self.top_ids = torch.zeros(num_slots, 0, dtype=torch.int32)

    @property
    def width(self) -> int:
        return self.top_values.shape[1]

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.valid, self.top_k, self.logprob, self.top_values, self.top_ids)
        )

    def invalidate(self, slots: torch.Tensor) -> None:
        """These slots now hold other tokens' KV (or none)."""
        if slots.numel():
            self.valid[slots.to(self.valid.device)] = False

    def usable_run(self, slots: torch.Tensor, top_k: int) -> int:
        """How many of `slots`, from the first, hold an entry with at least top_k top
        entries."""
        if not slots.numel():
            return 0
        slots = slots.to(torch.int64)
        ok = self.valid[slots.to(self.valid.device)].cpu() & (self.top_k[slots.cpu()] >= top_k)
        bad = (~ok).nonzero()
        return int(bad[0, 0]) if bad.numel() else slots.numel()

    def read(self, slots: torch.Tensor, top_k: int) -> CachedRows:
        slots = slots.cpu().to(torch.int64)
        return CachedRows(
            self.logprob[slots].tolist(),
            self.top_values[slots, :top_k].tolist(),
            self.top_ids[slots, :top_k].tolist(),
        )

    def write(
        self,
        slots: torch.Tensor,
        logprobs: list[float],
        top_values: list[list[float]] | None,
        top_ids: list[list[int]] | None,
        skip_slot: int | None = None,
    ) -> int:
        """Keeps each position's entry in its slot's row (top rows of equal length k, or
        None for k = 0); a row already holding as many top entries is left as it is.
        skip_slot: a slot that holds no token's KV (prefill-only KV's dropped tokens).
        Returns the rows written."""
        n = len(logprobs)
        if slots.numel() != n or (top_values is not None and len(top_values) != n):
            raise ValueError(f"{slots.numel()} slots for {n} prompt positions")
        if not n:
            return 0
        k = len(top_values[0]) if top_values else 0
        if k > MAX_TOP_K:
            raise ValueError(f"top-k {k} is over the table's limit {MAX_TOP_K}")
        slots = slots.cpu().to(torch.int64)
        keep = (~self.valid[slots.to(self.valid.device)].cpu()) | (self.top_k[slots] < k)
        if skip_slot is not None:
            keep &= slots != skip_slot
        if not bool(keep.any()):
            return 0
        if k > self.width:
            self._widen(k)
        rows = keep.nonzero()[:, 0]
        target = slots[rows]
        self.logprob[target] = torch.tensor(logprobs, dtype=torch.float32)[rows]
        self.top_k[target] = k
        if k:
            self.top_values[target, :k] = torch.tensor(top_values, dtype=torch.float32)[rows]
            self.top_ids[target, :k] = torch.tensor(top_ids, dtype=torch.int32)[rows]
        self.valid[target.to(self.valid.device)] = True
        return int(rows.numel())

    def _widen(self, k: int) -> None:
        """Rows grow to the widest top-k asked for so far (lm-eval asks for 1)."""
        values = torch.zeros(self.num_slots, k, dtype=torch.float32)
        ids = torch.zeros(self.num_slots, k, dtype=torch.int32)
        values[:, : self.width] = self.top_values
        ids[:, : self.width] = self.top_ids
        self.top_values, self.top_ids = values, ids
