"""Hybrid prefilling, scheduler side: once SGLang has loaded the model (ModelRunner.load_model,
AFTER), its token-wise modules (MLPs, RMSNorms, rotary embeddings) are made to run chunk
by chunk (hybrid/chunking.py) with the chunk size from PREFILLONLY_HYBRID_PREFILL. A model
whose MLPs the transform does not recognise stays as it is, with a warning in the log.

Debugging: PREFILLONLY_HYBRID_LOG=<file> appends what was chunked at load, then one line
per chunked call."""

from __future__ import annotations

import logging
import os

from prefillonly_sgl.hybrid import chunking
from prefillonly_sgl.hybrid.settings import HybridSettings

logger = logging.getLogger(__name__)

LOG_ENV = "PREFILLONLY_HYBRID_LOG"


def _after_load_model(result, self, *args, **kwargs):
    settings = HybridSettings.from_env()
    if settings is None:
        return result
    log = os.environ.get(LOG_ENV) or None
    chunked = chunking.apply(self.model, settings.chunk_size, log)
    if log:
        with open(log, "a") as f:
            counts = " ".join(f"{kind}={len(names)}" for kind, names in chunked.items())
            f.write(f"hybrid_prefill applied chunk={settings.chunk_size} {counts}\n")
    if chunked["mlp"]:
        logger.info(
            "prefillonly: hybrid prefilling in chunks of %d tokens: %s",
            settings.chunk_size,
            ", ".join(f"{len(names)} {kind}" for kind, names in chunked.items()),
        )
    else:
        logger.warning(
            "prefillonly: hybrid prefilling found no decoder MLP in %s: the model runs unchunked",
            type(self.model).__name__,
        )
    return result


HOOKS = {
    "sglang.srt.model_executor.model_runner.ModelRunner.load_model": ("AFTER", _after_load_model),
}
