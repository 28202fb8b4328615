"""Hybrid prefilling (plain torch, no SGLang): layer_chunks.py runs a whole decoder layer in
query chunks (mode "layer", the default: only the residual stream and one layer's K/V
whole); chunking.py runs the token-wise modules (MLPs, norms, rotary) chunk by chunk (mode
"token", and inside the layers); settings.py: modes and chunk sizes, as the scheduler
process receives them. The SGLang side, which applies it to the loaded model in the
scheduler, is prefillonly_sgl/sglang_runtime/hybrid_prefill/.
"""
