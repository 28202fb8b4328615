"""prefillonly-sgl: an SGLang-based serving engine for LLMs used as classifiers, scorers
and rankers (one output token: label probabilities at the last prompt position).

Imports are lazy so that ``import prefillonly_sgl`` stays cheap (it runs at interpreter
start in CPU environments, see sglang_runtime/cpu_support).
"""

from __future__ import annotations

__version__ = "0.1.0"

_LAZY = {
    "Engine": "prefillonly_sgl.engine",
    "ScoreResult": "prefillonly_sgl.scoring.score_result",
    "STOCK_SGLANG": "prefillonly_sgl.engine",
    "default_model_path": "prefillonly_sgl.models.default_model",
    "PrefillOnlyError": "prefillonly_sgl.scoring.errors",
    "InvalidRequestError": "prefillonly_sgl.scoring.errors",
    "EngineClosedError": "prefillonly_sgl.scoring.errors",
    "EngineStartError": "prefillonly_sgl.scoring.errors",
    "EngineDiedError": "prefillonly_sgl.scoring.errors",
    # prefix-cache namespaces: `with cache_salt("tenant-a"): ...` (scoring/call_context.py)
    "cache_salt": "prefillonly_sgl.scoring.call_context",
    # the scoring DSL (prefillonly_sgl/dsl)
    "classifier": "prefillonly_sgl.dsl",
    "ranker": "prefillonly_sgl.dsl",
    "Prompt": "prefillonly_sgl.dsl",
    "use": "prefillonly_sgl.dsl",
    "set_default_backend": "prefillonly_sgl.dsl",
    "RemoteBackend": "prefillonly_sgl.dsl",
    "LocalEngineBackend": "prefillonly_sgl.dsl",
    "LabelError": "prefillonly_sgl.dsl",
    "Classification": "prefillonly_sgl.dsl",
    "Ranking": "prefillonly_sgl.dsl",
    "RankedItem": "prefillonly_sgl.dsl",
    # typed decisions (prefillonly_sgl/decisions)
    "decision": "prefillonly_sgl.dsl.decision",
    "Scale": "prefillonly_sgl.dsl.decision",
    "Options": "prefillonly_sgl.dsl.decision",
    "DecisionServer": "prefillonly_sgl.dsl.decision_server",
    # moderation by guard models and policies (prefillonly_sgl/moderation)
    "moderator": "prefillonly_sgl.dsl.moderation",
    "moderate": "prefillonly_sgl.dsl.moderation",
    "Moderation": "prefillonly_sgl.dsl.moderation",
}
__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'prefillonly_sgl' has no attribute {name!r}")
