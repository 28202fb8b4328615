"""Run token-wise work chunk by chunk (plain torch).

A prefill's peak memory is its largest intermediates, and for a long prompt those are the
token-wise ones: an MLP's gate/up projection makes tokens x 2 x intermediate_size values
(SmolLM2: 3072 per token; Llama-3.1-8B: 28672), ~5x what attention's inputs need. Work that
treats every token alone (MLP, projections, norms) gives the same rows whether it sees all
tokens or a slice, so it can run `chunk` tokens at a time, writing each slice of the
result into one preallocated output: its intermediates never exceed a chunk's. Attention,
which mixes tokens, still runs once over all of them (its kernels stay efficient and the
prefill-only KV layout is unchanged). After the PrefillOnly paper's hybrid prefilling.

What is chunked (`apply(model, chunk, whole_up_to)`), for inputs longer than `whole_up_to`
tokens only (default: the chunk; decode and shorter extends run as before):

    gated MLPs         gate/up (2 x intermediate per token) and the activation's product
    RMSNorms           their float32 copies of the residual stream (in bf16 models 2x its
                       size, and the norm makes several)
    rotary embeddings  the rotated q / k and the sin/cos rows: applied in place, chunk by
                       chunk, into the q / k the attention reads (no second copy)

`chunk_forward(module, chunk, token_args)` is the wrapper for the first two.

Debugging: `apply(..., log=path)` appends one line per chunked call (module kind, tokens,
chunks) to that file.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence

import torch
from torch import nn

from prefillonly_sgl.hooking.events import append_event

ORIGINAL = "_prefillonly_unchunked_forward"


def chunk_ranges(n: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) slices of n tokens, `chunk` each (the last one shorter)."""
    if chunk < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk}")
    return [(start, min(start + chunk, n)) for start in range(0, n, chunk)]


def run_in_chunks(fn: Callable, chunk: int, token_args: Sequence[int], *args, **kwargs):
    """fn(*args, **kwargs) computed chunk by chunk over dim 0 of the arguments at
    positions `token_args`. Outputs (a tensor or a tuple) are gathered into tensors
    allocated once, from the first chunk's shapes; a tuple member that is not per token
    (e.g. a linear layer's separate bias, or None) is taken from the first chunk."""
    n = args[token_args[0]].shape[0]
    outputs = None
    for start, end in chunk_ranges(n, chunk):
        sliced = list(args)
        for i in token_args:
            if i < len(args) and args[i] is not None:
                sliced[i] = args[i][start:end]
        result = fn(*sliced, **kwargs)
        parts = result if isinstance(result, tuple) else (result,)
        if outputs is None:
            outputs = [
                p.new_empty((n, *p.shape[1:]))
                if isinstance(p, torch.Tensor) and p.dim() > 0 and p.shape[0] == end - start
                else p
                for p in parts
            ]
        for out, part in zip(outputs, parts):
            if isinstance(out, torch.Tensor) and out is not part and out.shape[0] == n:
                out[start:end] = part
    return tuple(outputs) if isinstance(result, tuple) else outputs[0]


def _log_call(log: str | None, kind: str, n: int, chunk: int) -> None:
    if log:
        chunks = len(chunk_ranges(n, chunk))
        append_event(log, "hybrid_prefill.chunked", module=kind, tokens=n, chunks=chunks)


def chunk_forward(
    module: nn.Module,
    chunk: int,
    token_args: Sequence[int] = (0,),
    log: str | None = None,
    whole_up_to: int | None = None,
) -> None:
    """Make `module`'s forward run chunk by chunk on inputs longer than `whole_up_to`
    tokens (default `chunk`; positional arguments `token_args` are per token). Idempotent;
    `restore` undoes it."""
    original = module.__dict__.get(ORIGINAL) or module.forward
    kind = type(module).__name__
    limit = chunk if whole_up_to is None else whole_up_to

    def forward(self, *args, **kwargs):
        n = args[token_args[0]].shape[0]
        if n <= limit:
            return original(*args, **kwargs)
        _log_call(log, kind, n, chunk)
        return run_in_chunks(original, chunk, token_args, *args, **kwargs)

    module.__dict__[ORIGINAL] = original
    module.forward = types.MethodType(forward, module)


def restore(module: nn.Module) -> None:
    original = module.__dict__.pop(ORIGINAL, None)
    if original is not None:
        del module.forward


def chunk_rotary(
    module: nn.Module, chunk: int, log: str | None = None, whole_up_to: int | None = None
) -> None:
    """Make a rotary embedding (positions, query, key) -> (query, key) write its result
    into `query` / `key` chunk by chunk and return them, for inputs longer than
    `whole_up_to` tokens (default `chunk`). Position-wise, so the values are those of one
    whole call."""
    original = module.__dict__.get(ORIGINAL) or module.forward
    limit = chunk if whole_up_to is None else whole_up_to

    def forward(self, positions, query, key, *args, **kwargs):
        if positions.shape[0] <= limit or args or kwargs:
            return original(positions, query, key, *args, **kwargs)
        _log_call(log, type(self).__name__, positions.shape[0], chunk)
        for start, end in chunk_ranges(positions.shape[0], chunk):
            q, k = original(positions[start:end], query[start:end], key[start:end])
            query[start:end] = q.reshape(query[start:end].shape)
            key[start:end] = k.reshape(key[start:end].shape)
        return query, key

    module.__dict__[ORIGINAL] = original
    module.forward = types.MethodType(forward, module)


def is_mlp(module: nn.Module) -> bool:
    """A gated MLP of a decoder layer (Llama, Qwen2, Mistral, ... families)."""
    return (
        type(module).__name__.endswith("MLP")
        and hasattr(module, "gate_up_proj")
        and hasattr(module, "down_proj")
    )


# SGLang's RMSNorms called as norm(x[, residual[, post_residual_addition]]): Gemma's
# (scale 1 + weight) is the norm of Gemma 3, Qwen3.5 and Qwen3-Next layers (and of their
# per-head q / k norms, whose rows are tokens x heads: token-wise all the same).
RMS_NORMS = ("RMSNorm", "GemmaRMSNorm")


def is_rms_norm(module: nn.Module) -> bool:
    """An RMSNorm called as norm(x[, residual[, post_residual_addition]])."""
    return type(module).__name__ in RMS_NORMS and hasattr(module, "variance_epsilon")


def is_rotary(module: nn.Module) -> bool:
    """A rotary embedding called as rope(positions, query, key) -> (query, key)."""
    return "RotaryEmbedding" in type(module).__name__ and hasattr(module, "cos_sin_cache")


def apply(
    model: nn.Module, chunk: int, log: str | None = None, whole_up_to: int | None = None
) -> dict[str, list[str]]:
    """Chunks the token-wise modules of `model` (see the module docstring) on inputs longer
    than `whole_up_to` tokens (default `chunk`); returns the names chunked, by kind (all
    empty: the model family is not handled, and stays as it was)."""
    chunked: dict[str, list[str]] = {"mlp": [], "rms_norm": [], "rotary": []}
    seen = set()
    for name, module in model.named_modules():
        if id(module) in seen:  # rotary embeddings are shared between layers
            continue
        seen.add(id(module))
        if is_mlp(module):
            chunk_forward(module, chunk, log=log, whole_up_to=whole_up_to)
            chunked["mlp"].append(name)
        elif is_rms_norm(module):
            chunk_forward(module, chunk, (0, 1, 2), log, whole_up_to)
            chunked["rms_norm"].append(name)
        elif is_rotary(module):
            chunk_rotary(module, chunk, log=log, whole_up_to=whole_up_to)
            chunked["rotary"].append(name)
    return chunked
