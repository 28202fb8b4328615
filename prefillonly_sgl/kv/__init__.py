"""Prefill-only KV (issue 4): which tokens of a scoring request keep per-layer KV.

Plain Python decisions, no SGLang: the SGLang hooks live in
prefillonly_sgl/sglang_runtime/prefill_kv.py.
"""
