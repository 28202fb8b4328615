"""A whole decoder layer in query chunks (plain torch): hybrid prefilling the paper's way.

Token-wise chunking (chunking.py) leaves attention whole, and with it everything
attention's inputs and outputs need for every token at once: the residual stream and its
normed copy, q / k / v, the kernel's output, the output projection (~3,800 values per
token for SmolLM2, ~22,500 for Llama-3.1-8B shapes). Here a layer runs chunk by chunk
over the batch's rows, each chunk all the way through, so that only the residual stream
exists for every token, and of the layer's K / V only the rows the pool does not hold
(the tokens whose KV prefill-only KV drops), kept by the attention backend for the later
chunks (prefill_attention/layer_keys.py).

One mechanism for every layer shape: the layer's OWN forward (SGLang's code, whatever its
norms, multipliers, q / k norms, MLP or MoE) is called on rows [s, e) of the batch at a
time, and its one attention call is redirected during that slice (`QueryChunkSlot`): the
slice's queries, k and v go to the attention backend's forward_query_chunk, which writes
the k / v to the pool (the rows that own a slot) or keeps them for the later slices (the
rows that do not), and attends the queries to every key so far. Everything in a decoder
layer except attention treats each token alone, so slicing its per-token inputs is
exact; a slice's queries need the keys of earlier rows only, so one pass in order
computes the layer exactly.

    for each chunk [s, e) of the batch's rows:
        layer.forward(positions[s:e], stream[s:e], forward_batch, ...)
            ... its own norms, projections, rotary ...
            attn(q, k, v)  ->  forward_query_chunk(q, k, v): k / v to the pool or kept,
                               q against the pool, the kept keys and k / v (causal)
            ... its own output projection, norms, residual adds, MLP / MoE ...
        stream[s:e] = what it returned

Which layers qualify (`plan_layer`, decided once per layer at load): exactly one
attention module (SGLang's RadixAttention), a causal decoder one (no cross-attention,
no bidirectional or encoder-only attention, no logit soft-capping, equal q / k and v head
dims), nothing else that mixes tokens (a linear-attention, Mamba or convolution module
carries state along the sequence), and a forward whose residual convention is one of
SGLang's three:

- "stream": SGLang's layer-boundary layers (attn_boundary / ffn_boundary; Llama, Qwen2 /
  3, Qwen3-MoE, GLM-4, gpt-oss): the residual lives in forward_batch.residual_stream. The
  stream is folded into one complete tensor at the layer's entry and each slice runs
  on a stream written with its rows (scheduler_process.py, SGLang's side);
- "pair": forward(..., residual) -> (hidden, residual) (Granite, Gemma 3): the slices of
  both tensors in, their outputs written back in place (`PairStream`);
- "plain": forward(...) -> hidden, the complete stream (OLMo 2): the slice in, its output
  written back in place (`PlainStream`); only a forward declared to return a tensor.

The other arguments a layer gets are sliced where they are per token (`CallSlicer`: each
tensor along its dimension of the batch's length, positions (T,), Gemma 3's (1, T)
positions and (cos, sin) rows (1, T, D) alike); an argument that is not (a capture
callback, a tensor without a dimension of that length) leaves that call to the layer's
whole forward.

In float32 the values are SGLang's own (the same calls on fewer rows); in 16-bit formats
the "stream" convention's fold rounds the residual sum where SGLang's fused add-norm reads
it unrounded (a rounding-level difference).

`run_layer_in_chunks` at the end is the re-implemented Llama layer the GPU kit's
harness (benchmarks/harness/hf_llama_chunks.py) drives with a transformers Llama on a card
without SGLang; the engine does not use it.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from prefillonly_sgl.features.hybrid_prefill.chunking import chunk_ranges

# SGLang's attention module: a layer runs in query chunks when it holds exactly one.
ATTENTION_CLASS = "RadixAttention"
# Modules that mix tokens other than through attention (a recurrent state or a
# convolution along the sequence): a slice of rows would lose the rows before it.
SEQUENCE_MIXERS = ("LinearAttention", "Mamba", "GatedDeltaNet", "ShortConv", "Conv1d")
# The attention call's keywords a query chunk takes (gpt-oss's sinks); any other (MLA's
# k_rope, return_lse, sparse indexers...) asks for something forward_query_chunk lacks.
ATTENTION_KWARGS = ("sinks",)

STREAM, PAIR, PLAIN = "stream", "pair", "plain"

# Attend(q, k, v, start, end, sinks) -> (end - start, q_heads * v_head_dim): the slice's
# queries, keys (end - start, kv_heads, head_dim) and values
Attend = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LayerPlan:
    """How a qualifying layer runs in query chunks."""

    convention: str  # STREAM, PAIR or PLAIN
    attention: nn.Module  # its one RadixAttention
    signature: inspect.Signature  # of its forward


def plan_layer(layer: nn.Module) -> LayerPlan | str:
    """The plan for running `layer` in query chunks, or why it cannot (module docstring).
    Plain duck typing on the module tree and the forward's signature."""
    kinds = [type(m).__name__ for m in layer.modules()]
    mixers = sorted({k for k in kinds if any(part in k for part in SEQUENCE_MIXERS)})
    if mixers:
        return f"{', '.join(mixers)} mixes tokens outside attention (state along the sequence)"
    attentions = [m for m in layer.modules() if type(m).__name__ == ATTENTION_CLASS]
    if len(attentions) != 1:
        return f"{len(attentions)} attention modules (query chunks redirect exactly one)"
    why = _attention_refusal(attentions[0])
    if why:
        return why
    try:
        signature = inspect.signature(layer.forward)
    except (TypeError, ValueError):
        return "its forward has no signature to read"
    params = signature.parameters
    missing = [p for p in ("hidden_states", "forward_batch") if p not in params]
    if missing:
        return f"its forward takes no {' / '.join(missing)}"
    returns = _annotation_text(signature.return_annotation).lower()
    boundary = hasattr(layer, "attn_boundary") and hasattr(layer, "ffn_boundary")
    if boundary and "residual" in params:
        return "both a residual argument and SGLang's layer boundaries"
    if boundary:
        convention = STREAM
    elif "residual" in params:
        if "tuple" not in returns:
            return "a residual argument, but its forward is not declared to return a pair"
        convention = PAIR
    elif "tensor" in returns and "tuple" not in returns:
        convention = PLAIN
    else:
        return (
            "no residual convention known (no layer boundary, no residual argument, "
            "no tensor return declared)"
        )
    return LayerPlan(convention, attentions[0], signature)


def _attention_refusal(attn: nn.Module) -> str | None:
    attn_type = getattr(attn, "attn_type", None)
    attn_type = getattr(attn_type, "value", attn_type)
    if getattr(attn, "is_cross_attention", False):
        return "cross-attention"
    if attn_type not in (None, "decoder"):
        return f"{attn_type} attention (query chunks are causal)"
    if getattr(attn, "logit_cap", 0) and attn.logit_cap > 0:
        return "attention logit soft-capping (the chunk kernels do not apply it)"
    if getattr(attn, "use_irope", False):
        return "chunked local attention (iRoPE)"
    if getattr(attn, "qk_head_dim", None) != getattr(attn, "v_head_dim", None):
        return "different q / k and v head dims"
    return None


def _annotation_text(annotation) -> str:
    if annotation is inspect.Signature.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    if isinstance(annotation, type):
        return annotation.__qualname__
    return str(annotation)


# -- the arguments of one call, per slice --------------------------------------------

_SCALARS = (bool, int, float, str, type(None))


def token_dim(tensor: torch.Tensor, n: int) -> int | None:
    """The dimension of a per-token tensor that runs over the batch's n rows: the first
    of length n ((T, ...), Gemma 3's (1, T) positions and (1, T, D) rotary rows, M-RoPE's
    (3, T)); None when no dimension has that length."""
    return next((d for d, size in enumerate(tensor.shape) if size == n), None)


class CallSlicer:
    """One call's arguments (bound to the layer's forward) cut to rows [start, end).
    `refusal` says why the call cannot be cut (None when it can): an argument that is
    neither per token nor a plain value the slices can share. `own` names the arguments
    the caller replaces per slice (the stream, the residual) or passes whole (the batch)."""

    def __init__(self, bound: inspect.BoundArguments, n: int, own: tuple) -> None:
        self.bound = bound
        self.n = n
        self.refusal = None
        for name, value in bound.arguments.items():
            if name in own:
                continue
            values = value.values() if _is_var_kw(bound.signature, name) else (value,)
            for member in values:
                why = self._refuse(member)
                if why:
                    self.refusal = f"argument {name!r}: {why}"
                    return

    def _refuse(self, value) -> str | None:
        if isinstance(value, torch.Tensor):
            return None if token_dim(value, self.n) is not None else "not per token"
        if isinstance(value, (tuple, list)):
            return next((w for w in map(self._refuse, value) if w), None)
        if isinstance(value, _SCALARS):
            return None
        return f"a {type(value).__name__} the slices cannot share"

    def call(self, start: int, end: int, replace: dict) -> tuple[tuple, dict]:
        """(args, kwargs) for rows [start, end), with `replace`'s arguments as given."""
        signature, given = self.bound.signature, self.bound.arguments
        arguments = {}
        for name in signature.parameters:  # in the signature's order, as binding keeps it
            if name in replace:
                arguments[name] = replace[name]
            elif name not in given:
                continue
            elif _is_var_kw(signature, name):
                arguments[name] = {k: self._cut(v, start, end) for k, v in given[name].items()}
            else:
                arguments[name] = self._cut(given[name], start, end)
        bound = inspect.BoundArguments(self.bound.signature, arguments)
        return bound.args, bound.kwargs

    def _cut(self, value, start: int, end: int):
        if isinstance(value, torch.Tensor):
            return value.narrow(token_dim(value, self.n), start, end - start)
        if isinstance(value, (tuple, list)):
            return type(value)(self._cut(v, start, end) for v in value)
        return value


def _is_var_kw(signature: inspect.Signature, name: str) -> bool:
    param = signature.parameters.get(name)
    return param is not None and param.kind is inspect.Parameter.VAR_KEYWORD


# -- the residual stream through the slices (the "pair" and "plain" conventions) -----


def write_rows(dest: torch.Tensor, value: torch.Tensor) -> None:
    if value.data_ptr() != dest.data_ptr() or value.stride() != dest.stride():
        dest.copy_(value)


def _shares(a: torch.Tensor, b: torch.Tensor | None) -> bool:
    return b is not None and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class PlainStream:
    """forward(..., hidden_states) -> the complete stream: each slice's output written
    back over its input rows (the layer has read them; later slices never do)."""

    def __init__(self, hidden: torch.Tensor) -> None:
        self.x = hidden

    def inputs(self, start: int, end: int) -> dict:
        return {"hidden_states": self.x[start:end]}

    def take(self, out, start: int, end: int) -> None:
        check_rows(out, end - start, "a tensor")
        write_rows(self.x[start:end], out)

    def result(self):
        return self.x


class PairStream:
    """forward(..., hidden_states, residual) -> (hidden, residual), the stream being
    their sum (Granite, Gemma 3). Both stay as SGLang has them, written back in place; at
    the first layer (no residual yet) the embedding's rows take the residual and the
    hidden output gets a buffer of its own."""

    def __init__(self, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
        self.h, self.r = hidden, residual
        self.h_out = None

    def inputs(self, start: int, end: int) -> dict:
        residual = None if self.r is None else self.r[start:end]
        return {"hidden_states": self.h[start:end], "residual": residual}

    def take(self, out, start: int, end: int) -> None:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise RuntimeError(f"a (hidden, residual) layer returned {type(out).__name__}")
        h, r = out
        check_rows(h, end - start, "a hidden tensor")
        check_rows(r, end - start, "a residual tensor")
        if self.r is None:  # first layer: outputs go to (new buffer, the embedding's rows)
            if self.h_out is None:
                self.h_out = h.new_empty((self.h.shape[0], *h.shape[1:]))
            h_dest, r_dest = self.h_out[start:end], self.h[start:end]
        else:
            h_dest, r_dest = self.h[start:end], self.r[start:end]
        if _shares(h, r_dest):  # written second: keep it from being overwritten first
            h = h.clone()
        write_rows(r_dest, r)
        write_rows(h_dest, h)

    def result(self):
        if self.r is None:
            return self.h_out, self.h
        return self.h, self.r


def check_rows(value, rows: int, what: str) -> None:
    if not isinstance(value, torch.Tensor) or value.shape[0] != rows:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise RuntimeError(
            f"a layer run in query chunks returned {shape} for {what} of {rows} rows"
        )


# -- the attention call of a slice ----------------------------------------------------


class QueryChunkSlot:
    """The redirect of one layer's attention while it runs in query chunks. Outside a
    layer's chunked forward it is inactive and the attention runs as SGLang's.

    Per slice [start, end): the attention's q and k / v (as (end - start, kv_heads,
    head_dim)) go to `attend(q, k, v, start, end, sinks=)`, which keeps what the later
    slices read (the pool, or the backend's kept keys: nothing whole here)."""

    def __init__(self) -> None:
        self.active = False
        # Seen on the layer's own (unchunked) calls: its attention was told not to save
        # the KV (save_kv_cache=False: a fused rotary kernel wrote it, as SGLang's Qwen3-MoE
        # and gpt-oss do on CUDA with a bf16 pool). Such a layer runs whole: its slices
        # would leave the pool's write to a kernel that never sees them.
        self.writes_own_kv = False
        self._clear()

    def _clear(self) -> None:
        self.attend = None
        self.rows = 0
        self.start = self.end = 0
        self.calls = 0

    def begin(self, rows: int, attend: Attend) -> None:
        self.active, self.attend, self.rows = True, attend, rows

    def slice(self, start: int, end: int) -> None:
        self.start, self.end, self.calls = start, end, 0

    def finish(self) -> None:
        self.active = False
        self._clear()

    def __call__(self, attn, q, k, v, save_kv_cache: bool, args: tuple, kwargs: dict):
        """The attention call of the current slice: (end - start, heads * v_head_dim)."""
        start, end = self.start, self.end
        unknown = sorted(set(kwargs) - set(ATTENTION_KWARGS))
        if not save_kv_cache:
            self.writes_own_kv = True  # its later forwards run whole (the layer's wrapper)
        if args or unknown or k is None or v is None or not save_kv_cache or self.calls:
            raise RuntimeError(
                f"layer {getattr(attn, 'layer_id', '?')}'s attention was called in a way "
                "a query chunk does not take (extra arguments "
                f"{unknown or list(args)}, no k / v, KV saved elsewhere, or a second call); "
                "run with hybrid_prefill_mode='token'"
            )
        self.calls += 1
        k = k.reshape(end - start, attn.tp_k_head_num, attn.qk_head_dim)
        v = v.reshape(end - start, attn.tp_v_head_num, attn.v_head_dim)
        return self.attend(q, k, v, start, end, sinks=kwargs.get("sinks"))


def redirect_attention(attn: nn.Module, slot: QueryChunkSlot) -> None:
    """The layer's attention module (SGLang's RadixAttention, per instance): its call
    goes to the slot while the layer runs in query chunks, to its own forward otherwise."""
    stock = attn.forward

    def forward(self, q, k, v, forward_batch, save_kv_cache=True, *args, **kwargs):
        if slot.active:
            return slot(self, q, k, v, save_kv_cache, args, kwargs)
        if not save_kv_cache:
            slot.writes_own_kv = True
        return stock(q, k, v, forward_batch, save_kv_cache, *args, **kwargs)

    attn.forward = types.MethodType(forward, attn)


def run_slices(
    forward: Callable,
    slicer: CallSlicer,
    stream,
    slot: QueryChunkSlot,
    chunk: int,
    attend: Attend,
):
    """The layer over the batch's rows, `chunk` at a time: its own forward per slice, its
    attention through `slot` to `attend`; returns what the layer returns for the whole
    batch."""
    slot.begin(slicer.n, attend)
    try:
        for start, end in chunk_ranges(slicer.n, chunk):
            slot.slice(start, end)
            args, kwargs = slicer.call(start, end, stream.inputs(start, end))
            stream.take(forward(*args, **kwargs), start, end)
        return stream.result()
    finally:
        slot.finish()


def torch_stream(convention: str, bound: inspect.BoundArguments):
    """The stream of a "pair" or "plain" layer's call (a "stream" layer's is SGLang's)."""
    hidden = bound.arguments["hidden_states"]
    if convention == PAIR:
        return PairStream(hidden, bound.arguments.get("residual"))
    if convention == PLAIN:
        return PlainStream(hidden)
    raise ValueError(f"the {convention!r} convention's stream is SGLang's")


# -- the GPU kit's harness: a re-implemented Llama layer (no SGLang) ------------------


def kv_buffers(x: torch.Tensor, layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's whole K and V, (T, kv_heads, head_dim), shaped like the attention
    layer's k / v views."""
    radix = layer.self_attn.attn
    n = x.shape[0]
    k = x.new_empty((n, radix.tp_k_head_num, radix.qk_head_dim))
    v = x.new_empty((n, radix.tp_v_head_num, radix.v_head_dim))
    return k, v


def run_layer_in_chunks(
    layer: nn.Module,
    positions: torch.Tensor,
    x: torch.Tensor,
    chunk: int,
    attend: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int], torch.Tensor],
    mlp_kwargs: dict | None = None,
) -> torch.Tensor:
    """A Llama-shaped layer (input norm, qkv_proj, rotary_emb, o_proj, fused add-norm,
    MLP) over x's rows, `chunk` rows at a time, x (the complete residual stream) updated
    in place and returned. Only benchmarks/harness/hf_llama_chunks.py calls it: a card
    without SGLang runs transformers' Llama through it (benchmarks/gpu_prefill.py)."""
    attn = layer.self_attn
    k_all, v_all = kv_buffers(x, layer)
    mlp_kwargs = mlp_kwargs or {}
    for start, end in chunk_ranges(x.shape[0], chunk):
        rows = x[start:end]
        qkv, _ = attn.qkv_proj(layer.input_layernorm(rows))
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        q, k = attn.rotary_emb(positions[start:end], q, k)
        k_all[start:end] = k.view(end - start, *k_all.shape[1:])
        v_all[start:end] = v.view(end - start, *v_all.shape[1:])
        del qkv, k, v
        o = attend(q, k_all, v_all, start, end)
        del q
        o, _ = attn.o_proj(o)
        normed, summed = layer.post_attention_layernorm(o, rows)
        if summed.data_ptr() != rows.data_ptr():  # CUDA's fused add writes it in place
            rows.copy_(summed)
        del o, summed
        rows.add_(layer.mlp(normed, **mlp_kwargs))
    return x
