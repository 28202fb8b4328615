"""The scoring DSL: declare an LLM classifier or ranker as a decorated Python function.

    import prefillonly_sgl as prefillonly

    @prefillonly.classifier(labels=["good", "bad"])
    def credit_risk(history: str) -> str:
        return f"Applicant credit history:\\n{history}\\nCredit risk (good or bad):"

    credit_risk("...", engine=engine).label

Files: labels.py (label sets -> single label tokens), prompt.py (Prompt: shared prefix vs
item; chat templates), signature.py (pydantic input validation), request.py (compiled
score requests), results.py (result models), backends.py (local Engine, remote
/v1/score, the default backend), function.py (what both decorators share),
classifier.py and ranker.py (the decorators), endpoint.py (each function as a typed
endpoint of `prefillonly serve --app`), app_client.py (a remote call through that endpoint).
Compilation is plain Python; only the backends run anything.
"""

from prefillonly_sgl.dsl.backends import (
    Backend,
    LocalEngineBackend,
    RemoteBackend,
    RemoteBackendError,
    set_default_backend,
    use,
)
from prefillonly_sgl.dsl.classifier import Classifier, classifier
from prefillonly_sgl.dsl.labels import LabelError, LabelSet, compile_labels, label_set
from prefillonly_sgl.dsl.prompt import Prompt
from prefillonly_sgl.dsl.ranker import Ranker, ranker
from prefillonly_sgl.dsl.request import CompiledCall, ScoreRequest
from prefillonly_sgl.dsl.results import Classification, RankedItem, Ranking
from prefillonly_sgl.dsl.signature import DeclarationError

__all__ = [
    "Backend",
    "Classification",
    "Classifier",
    "CompiledCall",
    "DeclarationError",
    "LabelError",
    "LabelSet",
    "LocalEngineBackend",
    "Prompt",
    "RankedItem",
    "Ranker",
    "Ranking",
    "RemoteBackend",
    "RemoteBackendError",
    "ScoreRequest",
    "classifier",
    "compile_labels",
    "label_set",
    "ranker",
    "set_default_backend",
    "use",
]
