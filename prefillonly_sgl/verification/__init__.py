"""Checking against references (plain Python over transformers, no SGLang):
reference.py (label probabilities from a plain transformers forward: the parity tests'
and benchmarks' reference), verify.py (`prefillonly verify MODEL`: a model's scores
through the Engine against it, feature by feature; its parts: probes.py, the probes, the
reference's answers and their checks on one engine; variants.py, the feature sets and one
engine per variant; merged_lora.py, --lora's adapter merged into the reference;
report.py, the report and its text) and quality_metrics.py (accuracy, ROC AUC, NDCG for
the pipelines).

May import the Engine and the runtime; nothing but the command line, the pipelines and
the tests imports it.
"""
