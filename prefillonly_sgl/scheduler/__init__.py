"""The JCT-aware scheduler's decisions (plain Python, no SGLang): the job-time model
(jct_model.py) and its saved profiles (profiles.py), what requests share (prefix_marks.py),
the policy that picks each prefill batch (policy.py) and its settings (settings.py). The
SGLang side is prefillonly_sgl/sglang_runtime/jct_scheduler/.
"""
