"""Prefill-only KV: which tokens of a scoring request keep per-layer KV (policy.py) and
what crosses SGLang's processes for it (messages.py). Plain Python, no SGLang: the hooks
live in prefillonly_sgl/sglang_runtime/prefill_kv/.
"""
