"""GPU side of the prefill-only attention backend (imported only on a CUDA engine).

Stock FlashInferAttnBackend already computes only what is new in an extend batch: ragged
attention of the new tokens over their own k / v (causal), merged by log-sum-exp with
paged attention over the cached prefix in the pool (`use_ragged`, on unless
deterministic inference or SGLANG_FLASHINFER_USE_PAGED is set; the paged fallback still
computes new queries only). So this subclass changes nothing yet: it is registered under
"flashinfer" by prefill_attention.register() so that prefill-only KV (issue 4: suffix KV
never written to the pool) has one place to change what forward_extend saves.
Not exercised on the CPU development machines.
"""

from __future__ import annotations

from sglang.srt.layers.attention.flashinfer_backend import FlashInferAttnBackend


class PrefillOnlyFlashInferBackend(FlashInferAttnBackend):
    pass
