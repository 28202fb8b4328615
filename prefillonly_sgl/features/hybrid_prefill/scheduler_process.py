"""Hybrid prefilling, scheduler side: once SGLang has loaded the model (ModelRunner.load_model,
AFTER), with the feature's settings from the process's configuration (process_state.py):

- its token-wise modules (MLPs, RMSNorms, rotary embeddings) are made to run chunk by
  chunk (chunking.py), both modes;
- mode "layer": its Llama / Qwen2 decoder layers get a forward that runs an extend batch
  longer than the chunk in query chunks, the whole layer per chunk
  (layer_chunks.py), attending through the prefill-only attention backend's
  forward_query_chunk. Other batches (short ones, decode) take SGLang's own forward.

A model whose MLPs the transform does not recognise stays as it is, with a warning in the
log; one whose layers are not of the handled shape keeps attention whole (token mode),
also with a warning.

The layer forward works on SGLang's residual stream (layer_boundary.residual.batch): it
folds the stream into one complete tensor (the embedding at the first layer, its own
output after), updates it in place, and leaves it as the stream's written residual, which
the next layer and the final norm read as SGLang's own layers would.

Debugging: PREFILLONLY_HYBRID_LOG=<file> appends structured events (hooking/events.py):
"hybrid_prefill.applied" at load (what was chunked), "hybrid_prefill.chunked" per chunked
call and "hybrid_prefill.layers" per batch whose layers ran in query chunks."""

from __future__ import annotations

import logging
import types

from sglang.srt.layers.layer_boundary.residual import batch as residual_batch
from sglang.srt.model_executor.forward_context import get_attn_backend

from prefillonly_sgl import environment
from prefillonly_sgl.features.hybrid_prefill import chunking, layer_chunks
from prefillonly_sgl.hooking import process_state
from prefillonly_sgl.hooking.events import append_event

logger = logging.getLogger(__name__)


def _after_load_model(result, self, *args, **kwargs):
    settings = process_state.current().settings("hybrid_prefill")
    if settings is None:
        return result
    log = process_state.current().switches.hybrid_log
    chunked = chunking.apply(self.model, settings.chunk_size, log)
    layers = []
    if settings.mode == "layer":
        layers = _chunk_layers(self.model, settings.chunk_size, log)
    if log:
        append_event(
            log,
            "hybrid_prefill.applied",
            chunk=settings.chunk_size,
            mode=settings.mode,
            chunked={kind: len(names) for kind, names in chunked.items()},
            layers=len(layers),
        )
    if chunked["mlp"]:
        logger.info(
            "prefillonly: hybrid prefilling in chunks of %d tokens: %s, %d decoder layers "
            "in query chunks",
            settings.chunk_size,
            ", ".join(f"{len(names)} {kind}" for kind, names in chunked.items()),
            len(layers),
        )
    else:
        logger.warning(
            "prefillonly: hybrid prefilling found no decoder MLP in %s: the model runs unchunked",
            type(self.model).__name__,
        )
    if settings.mode == "layer" and not layers:
        logger.warning(
            "prefillonly: hybrid prefilling found no Llama / Qwen2 decoder layer in %s: "
            "attention stays whole (token-wise chunks only)",
            type(self.model).__name__,
        )
    cuda_opt_in = process_state.current().switches.cuda_query_chunks
    if layers and "cuda" in str(self.device) and not cuda_opt_in:
        logger.warning(
            "prefillonly: hybrid prefilling mode 'layer' on CUDA is opt-in until its FlashInfer "
            "path has run on a GPU (set %s=1): attention stays whole (token-wise chunks only)",
            environment.CUDA_QUERY_CHUNKS,
        )
    return result


def _chunk_layers(model, chunk: int, log: str | None) -> list[str]:
    names = []
    for name, module in model.named_modules():
        if layer_chunks.is_chunkable_layer(module):
            _install(module, chunk, log)
            names.append(name)
    return names


def _install(layer, chunk: int, log: str | None) -> None:
    original = layer.forward
    first = getattr(layer.self_attn.attn, "layer_id", 0) == 0

    def forward(self, positions, hidden_states, forward_batch, capture_output=None, **kwargs):
        backend = get_attn_backend()
        if (
            capture_output is not None
            or kwargs
            or hidden_states.shape[0] <= chunk
            or not forward_batch.forward_mode.is_extend()
            or not getattr(backend, "supports_query_chunks", lambda _: False)(forward_batch)
        ):
            return original(positions, hidden_states, forward_batch, capture_output, **kwargs)
        if first and log:
            append_event(log, "hybrid_prefill.layers", tokens=hidden_states.shape[0], chunk=chunk)
        x = residual_batch.fold(hidden_states, forward_batch)  # complete, written stream
        radix = self.self_attn.attn

        def attend(q, k_all, v_all, start, end):
            return backend.forward_query_chunk(q, k_all, v_all, radix, forward_batch, start, end)

        return layer_chunks.run_layer_in_chunks(
            self, positions, x, chunk, attend, {"forward_batch": forward_batch}
        )

    layer.forward = types.MethodType(forward, layer)


HOOKS = {
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": ("AFTER", _after_load_model),
}
