"""The keys a decoder layer run in query chunks keeps for its later chunks (plain torch).

A layer run in query chunks (features/hybrid_prefill/layer_chunks.py) computes a chunk's
k / v, and the queries of its later chunks attend to them. A row that owns a pool slot is
written there as its chunk runs (the backends' forward_query_chunk) and read back from
the pool; a row whose KV prefill-only KV drops (DROPPED_SLOT: the dummy slot, no KV
kept) has nowhere to be read back from, so the layer keeps those of a request that
continues past the chunk here, until that request's last chunk: its dropped new tokens'
(k, v), (n, kv_heads, head_dim) each, freed with that chunk (or with the layer's call).
Until 2026-11-28 the layer held its whole K / V beside the chunks, the pool's rows
included: a cold prompt with half of it reusable now keeps half of that, one with all of
it reusable (a loglikelihood request, or prefill-only KV off) nothing.

    keys = LayerKeys()                                    # per layer call
    earlier = keys.step(plan, spans, kept, k, v)          # per chunk, before its attention

`kept_new_tokens` reads, per request of a forward, how many of its new tokens own a slot
(prefill-only KV's allocation records it on the host: PrefillKvState.kept).
"""

from __future__ import annotations

import torch

from prefillonly_sgl.features.prefill_attention.plan import QueryChunkPlan, Span, kept_keys
from prefillonly_sgl.hooking import process_state


class LayerKeys:
    """One layer call's kept keys, by request (see the module docstring)."""

    def __init__(self) -> None:
        self.by_request: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(
        self,
        plan: QueryChunkPlan,
        spans: list[Span],
        kept: list[int] | None,
        k: torch.Tensor,  # (end - start, Hkv, D): the chunk's own keys
        v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Keeps the chunk's rows that later chunks read and the pool does not hold, and
        returns the head's earlier new keys the pool does not hold ((plan.head_dropped,
        Hkv, D) each, None when there are none); the head's own are let go of once this
        is its last chunk."""
        earlier = None
        if plan.head is not None and plan.head_dropped:
            if plan.head not in self.by_request:
                raise RuntimeError(
                    f"query chunk [{plan.start}, {plan.end}): request {plan.head}'s earlier "
                    "keys without a pool slot were not kept (its earlier chunks ran "
                    "without this layer's keys)"
                )
            k_kept, v_kept = self.by_request[plan.head]
            earlier = (k_kept[: plan.head_dropped], v_kept[: plan.head_dropped])
        keep = kept_keys(spans, kept, plan.start, plan.end)
        if keep is not None:
            i, lo, hi, at = keep
            if i not in self.by_request:
                rows = spans[i].n_new - kept[i]
                self.by_request[i] = (
                    k.new_empty((rows, *k.shape[1:])),
                    v.new_empty((rows, *v.shape[1:])),
                )
            k_kept, v_kept = self.by_request[i]
            k_kept[at : at + hi - lo] = k[lo - plan.start : hi - plan.start]
            v_kept[at : at + hi - lo] = v[lo - plan.start : hi - plan.start]
        if plan.head is not None and (keep is None or keep[0] != plan.head):
            self.by_request.pop(plan.head, None)  # its last chunk: nothing later reads it
        return earlier


def kept_new_tokens(pool_rows: list[int], new_lens: list[int]) -> list[int]:
    """Per request of an extend batch (its request-table rows, its new-token counts), how
    many of its new tokens (the first ones) own a pool slot: all of them where
    prefill-only KV is off in this scheduler, else what its allocation recorded on the
    host (PrefillKvState.kept)."""
    state = process_state.current().prefill_kv
    if not state.active:
        return [int(n) for n in new_lens]
    kept = []
    for row, n_new in zip(pool_rows, new_lens):
        n = state.kept.get(int(row))
        if n is None:
            raise RuntimeError(
                f"prefill-only KV recorded no kept tokens for request row {row}: a layer run "
                "in query chunks cannot tell which of its keys the pool holds; start with "
                "--disable-prefill-only-kv and report this"
            )
        kept.append(min(int(n), int(n_new)))
    return kept
