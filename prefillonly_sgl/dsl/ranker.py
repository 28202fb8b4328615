"""``@ranker``: score many items against one shared context and sort them.

    @prefillonly.ranker(labels=["Yes", "No"], score="Yes")
    def recommend(profile: str, item: str) -> prefillonly.Prompt:
        return prefillonly.Prompt(
            prefix=f"User profile: {profile}\\n",
            item=f"Film: {item}\\nWould the user enjoy it? Answer Yes or No:",
        )

    ranking = recommend(profile, items=films, top_k=5, engine=engine)
    ranking.items[0].item, ranking.items[0].score, ranking.by_input[3].probs

The function is called once per item; the prefix it returns (the same for every item)
is the score request's query and the item texts its items: one request per call (the
engine's scheduler computes the prefix once, the items then hit the cache).

Under `prefillonly serve --app FILE` it is also POST /apps/recommend (endpoint.py); a
remote backend calls that endpoint when the server has it.

``setwise="<token>"``: one prompt lists every item, each followed by that dedicated token
(SGLang's setwise readout, score_extraction_token), and one forward reads the labels after
each occurrence: the items see one another, as in a listwise prompt, and the shared prefix
is computed once (from the prefix cache where it is there). Labels of one token each:

    @prefillonly.ranker(labels=["Yes", "No"], score="Yes", setwise="<|endoftext|>")
    def shortlist(need: str, item: str) -> prefillonly.Prompt:
        return prefillonly.Prompt(prefix=f"Need: {need}\nCandidates:\n", item=f"- {item}? Fits:")

``method="likelihood"``: no labels; the prompt names a continuation, and an item's score
is the continuation's mean log-probability per token after the item's prompt (query
likelihood: the query after each document; docs/reranking.md). One forward per item,
the prefix shared through the prefix cache (Engine.continuation_logprobs):

    @prefillonly.ranker(method="likelihood")
    def passages(query: str, document: str) -> prefillonly.Prompt:
        return prefillonly.Prompt(
            prefix="Please write a question based on this passage.\n",
            item=f"Passage: {document}\nQuestion:",
            continuation=f" {query}",
        )
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping

from prefillonly_sgl.dsl.backends import resolve_backend
from prefillonly_sgl.dsl.endpoint import ranker_endpoint
from prefillonly_sgl.dsl.function import RESERVED, ScoringFunction
from prefillonly_sgl.dsl.job import RankJob
from prefillonly_sgl.dsl.prompt import Prompt
from prefillonly_sgl.dsl.request import CompiledCall, ScoreRequest
from prefillonly_sgl.dsl.results import Ranking, label_probs, ranking_model
from prefillonly_sgl.dsl.signature import DeclarationError, validate_list
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.labels import NO_LABELS, LabelSet

RANKER_RESERVED = RESERVED + ("items", "top_k", "score")
METHODS = ("labels", "likelihood")
LIKELIHOOD_SCORES = ("mean", "sum")  # a likelihood ranker's named scores


class Ranker(ScoringFunction):
    """Call it with the shared arguments and ``items=[...]`` (values of the item
    parameter), optionally ``top_k=`` and ``score=``; returns a Ranking.

    Each call is a RankJob run by its backend (``Backend.run``; backends/ chooses
    which); the rows it returns become the Ranking here (``ranking``)."""

    kind = "ranker"

    def __init__(
        self,
        fn,
        labels=None,
        *,
        score=None,
        item: str | None = None,
        method: str = "labels",
        setwise: str | None = None,
        **options,
    ):
        if method not in METHODS:
            raise DeclarationError(
                f"{fn.__qualname__}: method={method!r}: expected one of {list(METHODS)}"
            )
        if setwise is not None and (
            not isinstance(setwise, str) or not setwise or method != "labels" or options.get("chat")
        ):
            raise DeclarationError(
                f"{fn.__qualname__}: setwise= names the dedicated token that follows each "
                "item (a non-empty str), for a ranker of labels without chat formatting"
            )
        self.setwise = setwise
        self.method = method
        self.scores_continuation = method == "likelihood"
        if self.scores_continuation:
            if labels is not None:
                raise DeclarationError(
                    f"{fn.__qualname__}: a likelihood ranker scores its prompt's "
                    "continuation; it takes no labels"
                )
            labels = NO_LABELS
        names = list(inspect.signature(fn).parameters)
        if not names:
            raise DeclarationError(f"{fn.__qualname__}: a ranker needs an item parameter")
        self.item_param = item or ("item" if "item" in names else names[-1])
        if self.item_param not in names:
            raise DeclarationError(
                f"{fn.__qualname__}: item={self.item_param!r} is not one of its parameters {names}"
            )
        super().__init__(
            fn, labels, reserved=RANKER_RESERVED, exclude=(self.item_param,), **options
        )
        self.item_type = self.inputs.hints.get(self.item_param, object)
        self.score_of = self._score_function(score)
        self.result_model = ranking_model(fn.__name__, self.item_type)

    # -- jobs and results (no backend needed) --------------------------------------------
    def job(self, *args, items, **kwargs) -> RankJob:
        """The job of one call (arguments and items validated)."""
        shared = self.inputs.validate(args, kwargs)
        if isinstance(items, str | bytes) or not hasattr(items, "__iter__"):
            raise InvalidRequestError(f"items must be a list, got {type(items).__name__}")
        items = validate_list("items", self.item_type, list(items))
        if not items:
            raise InvalidRequestError("items is empty: give at least one item to rank")
        return RankJob(self, shared, tuple(items))

    def compile(self, tokenizer, /, *args, items, **kwargs) -> CompiledCall:
        """The score request(s) for a call: one per distinct prefix (normally one)."""
        return self.job(*args, items=items, **kwargs).compile(tokenizer)

    def compile_arguments(
        self, tokenizer, arguments: list[dict], max_items, head: bool = False, images=None
    ) -> CompiledCall:
        if self.setwise is None:
            return super().compile_arguments(tokenizer, arguments, max_items, head, images)
        if images is not None:  # one prompt holds every item: no place for their images
            raise InvalidRequestError(
                f"{self.fn.__qualname__}: a setwise ranker reads text only; rank images "
                "pointwise (no setwise=)"
            )
        if head:  # SGLang pools a head at each anchor with its radix cache off only
            raise InvalidRequestError(
                f"{self.fn.__qualname__}: a setwise ranker reads label tokens at each anchor; "
                "on a model with a classification head, rank pointwise (no setwise=)"
            )
        return self._compile_setwise(tokenizer, arguments)

    def _compile_setwise(self, tokenizer, arguments: list[dict]) -> CompiledCall:
        """One request: the shared prefix as its query, every item's text followed by the
        anchor token as its one item; its answer has a row per anchor, the items in
        order."""
        prompts = [self.prompt(tokenizer, **a) for a in arguments]
        name, anchor = self.fn.__qualname__, self.setwise
        if len({p.prefix for p in prompts}) != 1:
            raise InvalidRequestError(
                f"{name}: a setwise ranker lists its items in one prompt after one prefix; "
                "its prompts returned different prefixes"
            )
        if any(anchor in p.text or p.continuation for p in prompts):
            raise InvalidRequestError(
                f"{name}: a prompt contains the setwise token {anchor!r} itself (or a "
                "continuation); it may only follow each item"
            )
        first = prompts[0]
        labels = self.label_ids(tokenizer, Prompt(prefix=first.prefix, item=first.item + anchor))
        if not all(isinstance(label, int) for label in labels):
            raise InvalidRequestError(
                f"{name}: a setwise ranker reads labels of one token each after every item"
            )
        request = ScoreRequest(
            query=first.prefix,
            items=("".join(p.item + anchor for p in prompts),),
            label_token_ids=tuple(labels),
            apply_softmax=self.normalize,
            score_extraction_token=anchor,
            lora_path=self.lora_path,
        )
        return CompiledCall(requests=(request,), where=tuple((0, i) for i in range(len(prompts))))

    def ranking(self, items, rows: list[list[float]], top_k=None, score=None) -> Ranking:
        """The Ranking of ``items`` from their probability rows (label order); ``score``
        overrides the declared score (see score_function)."""
        check_top_k(top_k)
        score_of = self.score_of if score is None else self._score_function(score)
        by_input = []
        for index, (item, row) in enumerate(zip(items, rows, strict=True)):
            if self.scores_continuation:  # a row: the continuation's token logprobs
                one = dict(score=score_of(row), probs={}, logprobs={}, token_logprobs=row)
            else:
                probs, logprobs = label_probs(self.labels, row)
                one = dict(score=score_of(probs), probs=probs, logprobs=logprobs)
            by_input.append(dict(item=item, index=index, **one))
        ranked = sorted(by_input, key=lambda r: -r["score"])  # stable: ties keep input order
        return self.result_model(items=ranked[:top_k], by_input=by_input)

    # -- run -----------------------------------------------------------------------------
    def __call__(
        self, *args, items, top_k: int | None = None, score=None, engine=None, **kwargs
    ) -> Ranking:
        """Rank ``items``; ``score`` overrides the declared score for this call."""
        job = self._checked_job(args, kwargs, items, top_k, score)
        backend = resolve_backend(engine)
        return self.ranking(job.items, backend.wait(backend.run(job)), top_k, score)

    async def acall(
        self, *args, items, top_k: int | None = None, score=None, engine=None, **kwargs
    ) -> Ranking:
        job = self._checked_job(args, kwargs, items, top_k, score)
        rows = await resolve_backend(engine).run(job)
        return self.ranking(job.items, rows, top_k, score)

    def _checked_job(self, args, kwargs, items, top_k, score) -> RankJob:
        """The job, with everything the call needs checked before anything is sent."""
        check_top_k(top_k)
        if score is not None:
            self._score_function(score)
        return self.job(*args, items=items, **kwargs)

    def _score_function(self, score) -> Callable:
        """What an item is sorted by: of its label probabilities (score_function), or for
        a likelihood ranker of its continuation's token logprobs (likelihood_score)."""
        if self.scores_continuation:
            return likelihood_score(score)
        return score_function(self.labels, score)

    def __prefillonly_endpoint__(self):
        """Its typed endpoint under `prefillonly serve --app` (see endpoint.py)."""
        return ranker_endpoint(self)

    def __repr__(self) -> str:
        if self.scores_continuation:
            return f"<ranker {self.fn.__qualname__} method='likelihood'>"
        return f"<ranker {self.fn.__qualname__} labels={list(self.labels.texts)}>"


def check_top_k(top_k) -> None:
    if top_k is not None and (type(top_k) is not int or top_k < 1):
        raise InvalidRequestError(f"top_k must be a positive integer or None, got {top_k!r}")


def likelihood_score(score) -> Callable[[list[float]], float]:
    """A likelihood ranker's item score from its continuation's token logprobs: "mean"
    (the default: per token, so continuations of different lengths compare), "sum" (the
    continuation's log-probability), or a function of the list."""
    if score is None or score == "mean":
        return lambda row: math.fsum(row) / len(row)
    if score == "sum":
        return math.fsum
    if callable(score) and not isinstance(score, type):
        return lambda row: float(score(row))
    raise InvalidRequestError(
        f"score={score!r}: a likelihood ranker sorts by 'mean', 'sum' or a function of the "
        "continuation's token logprobs"
    )


def score_function(labels: LabelSet, score) -> Callable[[dict], float]:
    """An item's score from its label probabilities (keyed by label text).

    score: None (the first label's probability), a label (its probability), a mapping
    label -> weight (the weighted sum, e.g. {"1": 1, ..., "5": 5}: the expected rating),
    or a function of the probabilities dict.
    """
    if score is None:
        first = labels.texts[0]
        return lambda probs: probs[first]
    if callable(score) and not isinstance(score, type):
        return lambda probs: float(score(probs))
    if isinstance(score, Mapping):
        if not score:
            raise InvalidRequestError("score={}: give a weight for at least one label")
        weights = {labels.text_of(k): float(w) for k, w in score.items()}
        return lambda probs: sum(w * probs[t] for t, w in weights.items())
    text = labels.text_of(score)
    return lambda probs: probs[text]


def ranker(
    labels=None,
    *,
    score=None,
    item: str | None = None,
    chat: bool = False,
    system: str | None = None,
    leading_space: bool | None = None,
    normalize: bool = True,
    length_normalize: bool = False,
    path: str | None = None,
    method: str = "labels",
    setwise: str | None = None,
    lora_path: str | None = None,
):
    """Declare a ranker. The decorated function takes the shared arguments and one item
    (the parameter named ``item``, else the last one, or the one named by ``item=``) and
    returns the prompt, normally a ``Prompt(prefix=<shared part>, item=<item part>)``.

    labels: as for ``classifier``. score: what to sort by (see ``score_function``):
    a label, a {label: weight} mapping or a function of the label probabilities.
    Other options: as for ``classifier``. A call sends one request with every item.
    path: its endpoint
    under ``prefillonly serve --app`` (default ``/apps/<name>``).
    method: "labels" (the default: the labels' probabilities after the prompt) or
    "likelihood" (no labels: the log-probability of the prompt's continuation; score
    "mean" per token by default, or "sum"; see the module doc).
    setwise: a dedicated token of the model's tokenizer: every item in one prompt, each
    followed by it, one forward for the call (SGLang's setwise readout; module doc).
    lora_path: the LoRA adapter its requests run under (as for ``classifier``).
    """
    options = dict(
        method=method,
        setwise=setwise,
        score=score,
        item=item,
        chat=chat,
        system=system,
        leading_space=leading_space,
        normalize=normalize,
        length_normalize=length_normalize,
        path=path,
        lora_path=lora_path,
    )
    if inspect.isfunction(labels):
        return Ranker(labels, None, **options)
    return lambda fn: Ranker(fn, labels, **options)
