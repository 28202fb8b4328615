"""Checking against references (plain Python over transformers, no SGLang):
reference.py (label probabilities from a plain transformers forward: the parity tests'
and benchmarks' reference), verify.py (`prefillonly verify MODEL`: a model's scores
through the Engine against it, feature by feature) and quality_metrics.py (accuracy,
ROC AUC, NDCG for the pipelines).

May import the Engine and the runtime; nothing but the command line, the pipelines and
the tests imports it.
"""
