"""``@classifier``: a prompt function that, called, returns the most probable label.

@prefillonly.classifier(labels=["good", "bad"])
def credit_risk(history: str) -> str:
    return f"Applicant credit history:\\n{history}\\nCredit risk (good or bad):"

r = credit_risk("...", engine=engine)     # r.label, r.probs, r.logprobs
rs = credit_risk.batch(histories)          # input order; one request per shared prefix
                                           # and batch_size inputs

Under `prefillonly serve --app FILE` it is also POST /apps/credit_risk (and .../batch),
see endpoint.py; a remote backend calls that endpoint when the server has it.
"""

from __future__ import annotations

import inspect

from prefillonly_sgl.dsl import contextual_calibration
from prefillonly_sgl.dsl.backends import resolve_backend
from prefillonly_sgl.dsl.endpoint import classifier_endpoints
from prefillonly_sgl.dsl.function import RESERVED, ScoringFunction
from prefillonly_sgl.dsl.job import ClassifyJob
from prefillonly_sgl.dsl.request import CompiledCall
from prefillonly_sgl.dsl.request_sending import DEFAULT_IN_FLIGHT, Progress
from prefillonly_sgl.dsl.results import Classification, classification_model, classifications
from prefillonly_sgl.dsl.signature import DeclarationError
from prefillonly_sgl.scoring.errors import InvalidRequestError

DEFAULT_BATCH_SIZE = 64  # inputs per score request in .batch(): a smooth progress bar


class Classifier(ScoringFunction):
    """Call it like the function (plus ``engine=``) to classify one input; ``batch`` /
    ``abatch`` classify many; ``compile`` shows the score requests without sending them.

    Each call is a ClassifyJob run by its backend (``Backend.run``: backends/ chooses
    the backend, which applies calibration); the rows it returns become typed results
    (results.classifications)."""

    kind = "classifier"

    def __init__(
        self, fn, labels=None, *, batch_size: int = DEFAULT_BATCH_SIZE, calibrate=None, **options
    ):
        super().__init__(fn, labels, reserved=RESERVED, **options)
        self.batch_size = batch_size
        self.result_model = classification_model(fn.__name__, self.labels)
        self.content = contextual_calibration.content_params(
            calibrate, self.inputs.params, fn.__qualname__
        )
        if self.content and not self.normalize:
            raise DeclarationError(
                f"{fn.__qualname__}: calibrate needs normalize=True (probabilities over the labels)"
            )

    # -- jobs and results (no backend needed) --------------------------------------------
    def job(self, *args, **kwargs) -> ClassifyJob:
        """The job of one call (arguments validated)."""
        return ClassifyJob(self, (self.inputs.validate(args, kwargs),))

    def batch_job(self, inputs, batch_size: int | None = None) -> ClassifyJob:
        """The job of a batch: each input a dict of keyword arguments, a tuple of positional
        ones, or the argument itself for a one-parameter function."""
        arguments = tuple(self._validate_input(i, x) for i, x in enumerate(inputs))
        return ClassifyJob(self, arguments, batch_size or self.batch_size)

    def compile(self, tokenizer, /, *args, **kwargs) -> CompiledCall:
        """The score request(s) for one call."""
        return self.job(*args, **kwargs).compile(tokenizer)

    def compile_batch(self, tokenizer, inputs, batch_size: int | None = None) -> CompiledCall:
        """The score requests for a batch: inputs sharing a prefix share a request."""
        return self.batch_job(inputs, batch_size).compile(tokenizer)

    def results(self, rows: list[list[float]]) -> list[Classification]:
        """Typed results from probability rows (label order), one per input."""
        return classifications(self, rows)

    def _validate_input(self, index: int, value) -> dict:
        if len(self.inputs.params) == 1:
            args, kwargs = (value,), {}
        elif isinstance(value, dict):
            args, kwargs = (), value
        elif isinstance(value, tuple | list):
            args, kwargs = tuple(value), {}
        else:
            raise InvalidRequestError(
                f"inputs[{index}]: {self.fn.__qualname__} takes {len(self.inputs.params)} "
                f"arguments: give each input as a dict or a tuple, got {value!r}"
            )
        try:
            return self.inputs.validate(args, kwargs)
        except InvalidRequestError as e:
            raise InvalidRequestError(f"inputs[{index}]: {e}") from None

    # -- run (backends/base.py: every call is one Backend.run; calibration happens there) -----
    def __call__(self, *args, engine=None, **kwargs) -> Classification:
        job = self.job(*args, **kwargs)
        backend = resolve_backend(engine)
        return classifications(self, backend.wait(backend.run(job)))[0]

    async def acall(self, *args, engine=None, **kwargs) -> Classification:
        job = self.job(*args, **kwargs)
        return classifications(self, await resolve_backend(engine).run(job))[0]

    def batch(
        self, inputs, *, engine=None, progress: bool = True, batch_size: int | None = None
    ) -> list[Classification]:
        """Classify every input; results in input order."""
        job = self.batch_job(list(inputs), batch_size)
        backend = resolve_backend(engine)
        with Progress(len(job), progress, self.fn.__name__) as bar:
            rows = backend.wait(backend.run(job, bar))
        return classifications(self, rows)

    async def abatch(
        self,
        inputs,
        *,
        engine=None,
        progress: bool = True,
        batch_size: int | None = None,
        max_in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> list[Classification]:
        """``batch`` for asyncio code, with up to ``max_in_flight`` requests at once."""
        job = self.batch_job(list(inputs), batch_size)
        with Progress(len(job), progress, self.fn.__name__) as bar:
            rows = await resolve_backend(engine).run(job, bar, max_in_flight)
        return classifications(self, rows)

    def __prefillonly_endpoint__(self):
        """Its typed endpoints under `prefillonly serve --app` (see endpoint.py)."""
        return classifier_endpoints(self)

    def __repr__(self) -> str:
        return f"<classifier {self.fn.__qualname__} labels={list(self.labels.texts)}>"


def classifier(
    labels=None,
    *,
    chat: bool = False,
    system: str | None = None,
    leading_space: bool | None = None,
    normalize: bool = True,
    length_normalize: bool = False,
    temperature: float = 1.0,
    batch_size: int = DEFAULT_BATCH_SIZE,
    calibrate=None,
    path: str | None = None,
    lora_path: str | None = None,
):
    """Declare a classifier: the decorated function builds the prompt (a str, or a
    ``Prompt(prefix=..., item=...)`` to mark a prefix shared across calls).

    labels: a list (str or int), an Enum class or a Literal[...] type; default: the
        function's return annotation (Literal[...] or an Enum). A label may be several
        tokens: its probability is then the product of its tokens' (docs/labels.md).
    chat: render the prompt as the user turn of the model's chat template, after a
        ``system`` turn when given, ending with the opening of the assistant turn.
    leading_space: force (True) or forbid (False) a space before each label; default:
        a space unless the prompt ends with whitespace.
    normalize: probabilities over the labels (True) or over the whole vocabulary.
    length_normalize: score a label of several tokens by its per-token (geometric mean)
        probability instead of the product, before normalize.
    temperature: temperature scaling (calibration): with normalize, the probabilities are
        the softmax of the labels' log-probabilities divided by it (SGLang's /v1/score
        temperature; >1 softens an overconfident model, <1 sharpens).
    batch_size: inputs per score request in ``batch`` / ``abatch``.
    calibrate: contextual calibration (contextual_calibration.py): the parameter(s) holding the
        content (a name, a list, or True for a one-parameter function). Their values are
        replaced by content-free texts behind the same other arguments, and the average
        label probabilities of those (the model's prior lean) divided out of each answer.
    path: its endpoint under ``prefillonly serve --app`` (default ``/apps/<name>``;
        batches at ``<path>/batch``).
    lora_path: the LoRA adapter (a name the engine or server loaded) every request of this
        function runs under (docs/lora.md); None: the base model.

    Usable bare (``@classifier``) when the return annotation gives the labels.
    """
    options = dict(
        chat=chat,
        system=system,
        leading_space=leading_space,
        normalize=normalize,
        length_normalize=length_normalize,
        temperature=temperature,
        batch_size=batch_size,
        calibrate=calibrate,
        path=path,
        lora_path=lora_path,
    )
    if inspect.isfunction(labels):  # @classifier without parentheses
        return Classifier(labels, None, **options)
    return lambda fn: Classifier(fn, labels, **options)
