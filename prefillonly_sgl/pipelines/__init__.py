"""Real pipelines on public data, each a DSL function run by the batch runner over
records, with its quality metrics (issue 14; `examples/` has a script per pipeline):

movielens      rank held-out liked films among sampled ones per user (hit rate, NDCG)
credit         German credit applicants, good / bad (accuracy, ROC AUC)
drug_reviews   label drug reviews positive / neutral / negative (accuracy, confusion)

Each ``run(...)`` takes an Engine (or starts one on the default model) and returns its
metrics as a dict; classifiers are run with and without contextual calibration.
"""
