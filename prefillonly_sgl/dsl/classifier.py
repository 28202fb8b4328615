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

import asyncio
import inspect

from prefillonly_sgl.dsl import app_client
from prefillonly_sgl.dsl.backends import Backend, resolve_backend
from prefillonly_sgl.dsl.endpoint import classifier_endpoints
from prefillonly_sgl.dsl.function import RESERVED, ScoringFunction
from prefillonly_sgl.dsl.request import CompiledCall, group_requests
from prefillonly_sgl.dsl.results import Classification, classification_model, classify_row
from prefillonly_sgl.dsl.runner import DEFAULT_IN_FLIGHT, asend, progress_bar, send
from prefillonly_sgl.errors import InvalidRequestError

DEFAULT_BATCH_SIZE = 64  # inputs per score request in .batch(): a smooth progress bar


class Classifier(ScoringFunction):
    """Call it like the function (plus ``engine=``) to classify one input; ``batch`` /
    ``abatch`` classify many; ``compile`` shows the score requests without sending them."""

    def __init__(self, fn, labels=None, *, batch_size: int = DEFAULT_BATCH_SIZE, **options):
        super().__init__(fn, labels, reserved=RESERVED, **options)
        self.batch_size = batch_size
        self.result_model = classification_model(fn.__name__, self.labels)

    # -- compile (no backend needed, only its tokenizer) ---------------------------------
    def compile(self, tokenizer, /, *args, **kwargs) -> CompiledCall:
        """The score request(s) for one call."""
        return self._compile(tokenizer, [self.inputs.validate(args, kwargs)], None)

    def compile_batch(self, tokenizer, inputs, batch_size: int | None = None) -> CompiledCall:
        """The score requests for a batch: inputs sharing a prefix share a request."""
        arguments = [self._validate_input(i, x) for i, x in enumerate(inputs)]
        return self._compile(tokenizer, arguments, batch_size or self.batch_size)

    def _compile(self, tokenizer, arguments: list[dict], max_items) -> CompiledCall:
        prompts = [self.prompt(tokenizer, **a) for a in arguments]
        label_ids = [self.label_ids(tokenizer, p) for p in prompts]
        return group_requests(prompts, label_ids, self.normalize, max_items, self.warm_prefix)

    def _validate_input(self, index: int, value) -> dict:
        """One batch input: the argument itself for a one-parameter function, else a dict
        of keyword arguments or a tuple of positional ones."""
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

    def _results(self, compiled: CompiledCall, answers) -> list[Classification]:
        return self._classify_rows(compiled.gather(answers))

    def _classify_rows(self, rows: list[list[float]]) -> list[Classification]:
        return [classify_row(self.result_model, self.labels, row) for row in rows]

    # -- run -----------------------------------------------------------------------------
    def __call__(self, *args, engine=None, **kwargs) -> Classification:
        backend = resolve_backend(engine)
        if app_client.served_by(self, backend):
            arguments = self.inputs.validate(args, kwargs)
            return self._classify_rows([app_client.classify_one(self, backend, arguments)])[0]
        compiled = self.compile(backend.tokenizer, *args, **kwargs)
        return self._results(compiled, send(backend, compiled))[0]

    async def acall(self, *args, engine=None, **kwargs) -> Classification:
        backend = resolve_backend(engine)
        if await app_client.aserved_by(self, backend):
            arguments = self.inputs.validate(args, kwargs)
            row = await asyncio.to_thread(app_client.classify_one, self, backend, arguments)
            return self._classify_rows([row])[0]
        compiled = self.compile(backend.tokenizer, *args, **kwargs)
        return self._results(compiled, await asend(backend, compiled))[0]

    def batch(
        self, inputs, *, engine=None, progress: bool = True, batch_size: int | None = None
    ) -> list[Classification]:
        """Classify every input; results in input order."""
        inputs = list(inputs)
        backend: Backend = resolve_backend(engine)
        if app_client.served_by(self, backend):
            arguments = [self._validate_input(i, x) for i, x in enumerate(inputs)]
            with progress_bar(len(inputs), progress, self.fn.__name__) as bar:
                rows = app_client.classify_many(
                    self, backend, arguments, batch_size or self.batch_size, bar
                )
            return self._classify_rows(rows)
        compiled = self.compile_batch(backend.tokenizer, inputs, batch_size)
        with progress_bar(len(inputs), progress, self.fn.__name__) as bar:
            answers = send(backend, compiled, bar)
        return self._results(compiled, answers)

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
        inputs = list(inputs)
        backend: Backend = resolve_backend(engine)
        if await app_client.aserved_by(self, backend):
            arguments = [self._validate_input(i, x) for i, x in enumerate(inputs)]
            with progress_bar(len(inputs), progress, self.fn.__name__) as bar:
                rows = await app_client.aclassify_many(
                    self, backend, arguments, batch_size or self.batch_size, bar, max_in_flight
                )
            return self._classify_rows(rows)
        compiled = self.compile_batch(backend.tokenizer, inputs, batch_size)
        with progress_bar(len(inputs), progress, self.fn.__name__) as bar:
            answers = await asend(backend, compiled, bar, max_in_flight)
        return self._results(compiled, answers)

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
    batch_size: int = DEFAULT_BATCH_SIZE,
    warm_prefix: bool = True,
    path: str | None = None,
):
    """Declare a classifier: the decorated function builds the prompt (a str, or a
    ``Prompt(prefix=..., item=...)`` to mark a prefix shared across calls).

    labels: a list (str or int), an Enum class or a Literal[...] type; default: the
        function's return annotation (Literal[...] or an Enum). Each must be one token.
    chat: render the prompt as the user turn of the model's chat template, after a
        ``system`` turn when given, ending with the opening of the assistant turn.
    leading_space: force (True) or forbid (False) a space before each label; default:
        a space unless the prompt ends with whitespace.
    normalize: probabilities over the labels (True) or over the whole vocabulary.
    batch_size: inputs per score request in ``batch`` / ``abatch``.
    warm_prefix: send the first input of each shared prefix alone first, so that the
        prefix is cached before the others are prefilled (see request.group_requests).
    path: its endpoint under ``prefillonly serve --app`` (default ``/apps/<name>``;
        batches at ``<path>/batch``).

    Usable bare (``@classifier``) when the return annotation gives the labels.
    """
    options = dict(
        chat=chat,
        system=system,
        leading_space=leading_space,
        normalize=normalize,
        batch_size=batch_size,
        warm_prefix=warm_prefix,
        path=path,
    )
    if inspect.isfunction(labels):  # @classifier without parentheses
        return Classifier(labels, None, **options)
    return lambda fn: Classifier(fn, labels, **options)
