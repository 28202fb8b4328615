"""The scoring DSL: declare an LLM classifier or ranker as a decorated Python function.

    import prefillonly_sgl as prefillonly

    @prefillonly.classifier(labels=["good", "bad"])
    def credit_risk(history: str) -> str:
        return f"Applicant credit history:\\n{history}\\nCredit risk (good or bad):"

    credit_risk("...", engine=engine).label

A call flows: classifier.py / ranker.py validate the arguments into a job (job.py) -> the
backend runs it (backends/: its __init__ chooses which; base.py is the interface,
local.py an Engine here, remote.py a server, server.py a serving runtime's own path;
registry.py keeps one per target) -> probability rows -> typed results (results.py).
Compiling a job: function.py (what both decorators share) with prompt.py (Prompt: shared
prefix vs item; chat templates), ../labels.py (label sets -> each label's tokens in
context, one or several), request.py (prompts grouped into score requests) and request_sending.py
(sending them). signature.py validates inputs with pydantic. Over HTTP: app_models.py
(the endpoint models), endpoint.py (`prefillonly serve --app`, server side),
app_client.py (what RemoteBackend posts there), gateway_client.py (through SGLang's
gateway: /v1/rerank, /v1/classify). contextual_calibration.py: contextual calibration of a
classifier. decision.py: @decision, typed questions about a state (decisions/ compiles
them; decision_server.py sends them to any decisions server; decision_endpoint.py serves
them). Everything but the backends is plain Python.
"""

from prefillonly_sgl.dsl import contextual_calibration
from prefillonly_sgl.dsl.backends import set_default_backend, use
from prefillonly_sgl.dsl.backends.base import Backend
from prefillonly_sgl.dsl.backends.local import LocalEngineBackend
from prefillonly_sgl.dsl.backends.remote import (
    RemoteAuthenticationError,
    RemoteBackend,
    RemoteBackendError,
)
from prefillonly_sgl.dsl.classifier import Classifier, classifier
from prefillonly_sgl.dsl.job import ClassifyJob, RankJob
from prefillonly_sgl.dsl.prompt import Prompt
from prefillonly_sgl.dsl.ranker import Ranker, ranker
from prefillonly_sgl.dsl.request import CompiledCall, ScoreRequest
from prefillonly_sgl.dsl.results import Classification, RankedItem, Ranking
from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.scoring.labels import LabelError, LabelSet, compile_labels, label_set

__all__ = [
    "Backend",
    "Classification",
    "Classifier",
    "ClassifyJob",
    "CompiledCall",
    "DeclarationError",
    "LabelError",
    "LabelSet",
    "LocalEngineBackend",
    "Prompt",
    "RankJob",
    "RankedItem",
    "Ranker",
    "Ranking",
    "RemoteBackend",
    "RemoteBackendError",
    "RemoteAuthenticationError",
    "ScoreRequest",
    "contextual_calibration",
    "classifier",
    "compile_labels",
    "label_set",
    "ranker",
    "set_default_backend",
    "use",
]
