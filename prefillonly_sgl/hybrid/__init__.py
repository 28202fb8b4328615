"""Hybrid prefilling: token-wise modules run over the tokens chunk by chunk, attention over
all of them at once (plain torch, no SGLang): chunking.py. The SGLang side, which applies
it to the loaded model in the scheduler, is prefillonly_sgl/sglang_runtime/hybrid_prefill/.
"""
