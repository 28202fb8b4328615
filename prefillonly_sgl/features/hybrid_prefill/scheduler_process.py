"""Hybrid prefilling, scheduler side: once SGLang has loaded the model (ModelRunner.load_model,
AFTER), with the feature's settings from the process's configuration (process_state.py):

- its token-wise modules (MLPs, RMSNorms, rotary embeddings) are made to run chunk by
  chunk (chunking.py), both modes;
- only forwards longer than settings.whole_limit's answer run in chunks: by default the
  largest batch stock SGLang builds with this scheduler's arguments (its prefill token
  budget, its largest prefill CUDA graph bucket), so every batch stock would run runs
  whole (and in its graphs) and only the unchunked long prompts stock never runs chunk;
- mode "layer": every decoder layer that qualifies (layer_chunks.plan_layer: one causal
  RadixAttention, nothing else mixing tokens, a known residual convention) gets a forward
  that runs an extend batch past that limit in query chunks: the layer's own
  forward per slice of rows, its RadixAttention redirected (per instance) to the
  attention backend's forward_query_chunk during the slice (layer_chunks.py), with the
  keys the backend keeps for the call's later slices (new_layer_keys: the rows the pool
  does not hold). Other
  batches (short ones, decode) take SGLang's own forward, and so does a call with an
  argument the slices cannot share (an aux-hidden-state capture).

A model whose MLPs the transform does not recognise stays as it is, with a warning in the
log; a layer class that does not qualify keeps attention whole (token-wise chunks only),
with a warning naming why.

Debugging: PREFILLONLY_HYBRID_LOG=<file> appends structured events (hooking/events.py):
"hybrid_prefill.applied" at load (what was chunked; `whole`: each layer class left whole
and why), "hybrid_prefill.chunked" per chunked call, "hybrid_prefill.layers" per batch
whose layers run in query chunks (from the first of them), and
"hybrid_prefill.whole_layer" once per layer class and reason a call was left whole."""

from __future__ import annotations

import logging
import types

import torch
from sglang.srt.arg_groups.model_override_base import resolved_view
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
from sglang.srt.layers.layer_boundary.residual.stream import ResidualStream
from sglang.srt.model_executor.forward_context import get_attn_backend
from torch import nn

from prefillonly_sgl.features.hybrid_prefill import chunking, layer_chunks
from prefillonly_sgl.features.hybrid_prefill.settings import whole_limit
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event
from prefillonly_sgl.machine import environment

logger = logging.getLogger(__name__)


def _after_load_model(result, self, *args, **kwargs):
    settings = process_state.current().settings("hybrid_prefill")
    if settings is None:
        return result
    log = process_state.current().switches.hybrid_log
    limit = _whole_limit(settings, self.server_args)
    chunked = chunking.apply(self.model, settings.chunk_size, log, whole_up_to=limit)
    layers, whole = [], {}
    if settings.mode == "layer":
        layers, whole = _chunk_layers(self.model, settings.chunk_size, limit, log)
    if log:
        append_event(
            log,
            "hybrid_prefill.applied",
            chunk=settings.chunk_size,
            whole_up_to=limit,
            mode=settings.mode,
            chunked={kind: len(names) for kind, names in chunked.items()},
            layers=len(layers),
            whole=whole,
        )
    if chunked["mlp"] or layers:
        logger.info(
            "prefillonly: hybrid prefilling in chunks of %d tokens for forwards over %d: %s, "
            "%d decoder layers in query chunks",
            settings.chunk_size,
            limit,
            ", ".join(f"{len(names)} {kind}" for kind, names in chunked.items()),
            len(layers),
        )
    else:
        logger.warning(
            "prefillonly: hybrid prefilling found no decoder MLP in %s: the model runs unchunked",
            type(self.model).__name__,
        )
    for layer_class, why in whole.items():
        logger.warning(
            "prefillonly: hybrid prefilling keeps %s layers of %s whole (token-wise chunks "
            "only): %s",
            layer_class,
            type(self.model).__name__,
            why,
        )
    cuda_opt_in = process_state.current().switches.cuda_query_chunks
    if layers and "cuda" in str(self.device) and not cuda_opt_in:
        logger.warning(
            "prefillonly: hybrid prefilling mode 'layer' on CUDA is opt-in until its FlashInfer "
            "path has run on a GPU (set %s=1): attention stays whole (token-wise chunks only)",
            environment.CUDA_QUERY_CHUNKS,
        )
    return result


def _whole_limit(settings, server_args) -> int:
    """settings.whole_limit with this scheduler's resolved SGLang arguments (SGLang keeps
    what it resolved, chunked_prefill_size among them, as declarations over the record:
    its resolved_view reads both)."""
    server_args = resolved_view(server_args)
    prefill = _field(getattr(server_args, "cuda_graph_config", None), "prefill")
    backend = _field(prefill, "backend")
    backend = getattr(backend, "value", backend)
    buckets = None
    if prefill is not None and backend not in (None, "disabled"):
        buckets = list(_field(prefill, "bs") or [])
    return whole_limit(
        settings,
        getattr(server_args, "max_prefill_tokens", None),
        getattr(server_args, "chunked_prefill_size", None),
        buckets,
    )


def _field(value, key: str):
    """A field of SGLang's graph configuration (a dataclass, or a dict once serialised)."""
    if value is None:
        return None
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _chunk_layers(
    model, chunk: int, limit: int, log: str | None
) -> tuple[list[str], dict[str, str]]:
    """Installs the query-chunk forward on every decoder layer that qualifies
    (layer_chunks.plan_layer); returns their names and, per layer class that does not,
    why."""
    names, whole = [], {}
    stack = _Stack(log)
    for name, layer in _decoder_layers(model):
        plan = layer_chunks.plan_layer(layer)
        if isinstance(plan, str):
            whole.setdefault(type(layer).__name__, plan)
            continue
        _install(layer, plan, chunk, limit, stack)
        names.append(name)
    return names, whole


def _decoder_layers(model):
    """The members of the model's layer stacks (an nn.ModuleList's children) that attend
    or otherwise mix tokens; not what lies inside one of them."""
    found: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or any(name.startswith(f"{f}.") for f in found):
            continue
        for index, child in enumerate(module):
            kinds = [type(m).__name__ for m in child.modules()]
            if any(
                k == layer_chunks.ATTENTION_CLASS
                or any(part in k for part in layer_chunks.SEQUENCE_MIXERS)
                for k in kinds
            ):
                found.append(f"{name}.{index}")
                yield found[-1], child


class _Stack:
    """What the model's chunked layers share: the log, and which of them reports a
    batch (the first one installed)."""

    def __init__(self, log: str | None) -> None:
        self.log = log
        self.first = None
        self.count = 0
        self.refused: set[tuple[str, str]] = set()

    def refuse_call(self, layer, why: str) -> None:
        """A call the layer's slices cannot take (said once per layer class and reason)."""
        key = (type(layer).__name__, why)
        if key in self.refused:
            return
        self.refused.add(key)
        logger.warning(
            "prefillonly: hybrid prefilling runs %s whole for this call: %s", key[0], why
        )
        if self.log:
            append_event(self.log, "hybrid_prefill.whole_layer", layer=key[0], reason=why)


# The layer's own arguments the slices replace (stream, residual) or pass whole (batch).
_OWN = ("hidden_states", "residual", "forward_batch")


def _install(layer, plan: layer_chunks.LayerPlan, chunk: int, limit: int, stack: _Stack) -> None:
    original = layer.forward
    slot = layer_chunks.QueryChunkSlot()
    layer_chunks.redirect_attention(plan.attention, slot)
    stack.first = stack.first or layer
    stack.count += 1
    attn = plan.attention

    def forward(self, *args, **kwargs):
        bound = plan.signature.bind(*args, **kwargs)
        hidden = bound.arguments["hidden_states"]
        forward_batch = bound.arguments["forward_batch"]
        if (
            not isinstance(hidden, torch.Tensor)
            or hidden.shape[0] <= limit
            or not forward_batch.forward_mode.is_extend()
        ):
            return original(*args, **kwargs)
        backend = get_attn_backend()
        if not getattr(backend, "supports_query_chunks", lambda _: False)(forward_batch):
            return original(*args, **kwargs)
        if slot.writes_own_kv:
            stack.refuse_call(self, "its attention's KV is written by a fused kernel")
            return original(*args, **kwargs)
        n = hidden.shape[0]
        slicer = layer_chunks.CallSlicer(bound, n, _OWN)
        if slicer.refusal:
            stack.refuse_call(self, slicer.refusal)
            return original(*args, **kwargs)
        if self is stack.first and stack.log:
            append_event(
                stack.log, "hybrid_prefill.layers", tokens=n, chunk=chunk, layers=stack.count
            )

        # what this layer call's later slices read and the pool does not hold (the keys of
        # rows whose KV prefill-only KV drops): the backend's, freed with the call
        layer_keys = backend.new_layer_keys()

        def attend(q, k, v, start, end, sinks=None):
            return backend.forward_query_chunk(
                q, k, v, attn, forward_batch, start, end, sinks=sinks, layer_keys=layer_keys
            )

        if plan.convention == layer_chunks.STREAM:
            stream = _BoundaryStream(hidden, forward_batch)
        else:
            stream = layer_chunks.torch_stream(plan.convention, bound)
        return layer_chunks.run_slices(original, slicer, stream, slot, chunk, attend)

    layer.forward = types.MethodType(forward, layer)


class _BoundaryStream:
    """SGLang's layer-boundary layers keep the residual in forward_batch.residual_stream
    (layer_boundary.residual): folded into one complete tensor x at the layer's entry (the
    embedding at the first layer, the previous layer's x after), each slice runs on a
    stream written with its rows of x, and its output, folded, goes back over them. x
    leaves as the stream's written residual, which the next layer (ours or SGLang's) and
    the final norm read as after SGLang's own layers."""

    def __init__(self, hidden, forward_batch) -> None:
        self.forward_batch = forward_batch
        self.x = residual_batch.fold(hidden, forward_batch)

    def inputs(self, start: int, end: int) -> dict:
        rows = self.x[start:end]  # the stream checks it is handed this very tensor
        self.forward_batch.residual_stream = ResidualStream(rows)
        return {"hidden_states": rows}

    def take(self, out, start: int, end: int) -> None:
        done = residual_batch.fold(out, self.forward_batch)
        layer_chunks.check_rows(done, end - start, "the folded stream")
        layer_chunks.write_rows(self.x[start:end], done)

    def result(self):
        return residual_batch.set_written(self.x, self.forward_batch)


HOOKS = {
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": ("AFTER", _after_load_model),
}
