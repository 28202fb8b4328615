"""Memory budget (Engine(memory_budget=...), serve --memory-budget): the KV pool gets what
the longest promised prompt's activations and the model leave of a budget.

    budget.py        the plan (plain Python): sizes, KV bytes per token, the pool
    measurement.py   measures the longest prompt once per settings and saves it
"""
