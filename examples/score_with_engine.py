"""The smallest use of prefillonly_sgl.Engine: score two items against a shared query.
Run: .venv/bin/python examples/score_with_engine.py
"""

import prefillonly_sgl

engine = prefillonly_sgl.Engine()  # the embedded default model, SmolLM2-135M-Instruct
tok = engine.tokenizer
labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" positive", " negative")]

query = "Review: The pills stopped my migraines within a week.\nSentiment: positive\n\n"
items = [
    "Review: Terrible nausea, I had to stop after two days.\nSentiment:",
    "Review: Works well and I have had no side effects at all.\nSentiment:",
]
result = engine.score(query, items, labels)
for item, (p_pos, p_neg) in zip(items, result.scores):
    print(f"p(positive)={p_pos:.3f} p(negative)={p_neg:.3f}  {item.splitlines()[0]}")
engine.shutdown()
