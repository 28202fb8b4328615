"""Compiled requests: what a DSL call sends to a backend (plain Python).

A call (or a batch of calls) compiles to a list of requests plus, for each input, where
its answer will be: (request index, item index). A function scoring labels compiles to
``ScoreRequest`` — SGLang's score request fields (query, items, label_token_ids,
apply_softmax), where a label of several tokens is a tuple of ids, and length_normalize;
a likelihood ranker to ``ContinuationRequest`` (query, items, one continuation per item:
Engine.continuation_logprobs's arguments).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from prefillonly_sgl.dsl.prompt import Prompt
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.labels import LabelIds


@dataclass(frozen=True)
class ScoreRequest:
    """One SGLang score request: the label probabilities after ``query + item`` per item."""

    query: str
    items: tuple[str, ...]
    label_token_ids: tuple[LabelIds, ...]  # a tuple: a label of several tokens
    apply_softmax: bool = True
    length_normalize: bool = False  # a label's per-token probability (Engine.score)
    # SGLang's setwise readout: the labels read at every occurrence of this dedicated token
    # in the (one) item, one row per occurrence (a setwise ranker's candidates, in order)
    score_extraction_token: str | None = None
    temperature: float = 1.0  # with apply_softmax: the labels' log-probabilities over it
    lora_path: str | None = None  # the LoRA adapter it runs under (None: the base model)
    images: tuple = ()  # the query's images (Prompt.images), as the function gave them
    item_images: tuple[tuple, ...] | None = None  # per item, its own (Prompt.item_images)

    @property
    def has_images(self) -> bool:
        return bool(self.images) or any(self.item_images or ())

    async def sent_to(self, score):
        """``score``'s answer to this request, for a function with Engine.async_score's
        signature (the engine's own, or a server's scoring path)."""
        images = {}
        if self.has_images:  # loaded by the engine or the server (scoring/images.py)
            images = {"images": list(self.images), "item_images": self.item_images_lists()}
        return await score(
            self.query,
            list(self.items),
            list(self.label_token_ids),
            apply_softmax=self.apply_softmax,
            length_normalize=self.length_normalize,
            **self.sglang_fields(),
            **images,
        )

    def item_images_lists(self) -> list[list] | None:
        return None if self.item_images is None else [list(x) for x in self.item_images]

    def sglang_fields(self) -> dict:
        """The SGLang score fields this request sets beyond the defaults (their names are
        /v1/score's and Engine.score's)."""
        fields = {}
        if self.score_extraction_token is not None:
            fields["score_extraction_token"] = self.score_extraction_token
        if self.temperature != 1.0:
            fields["temperature"] = self.temperature
        if self.lora_path is not None:  # Engine.score's keyword; a body field the guard takes
            fields["lora_path"] = self.lora_path
        return fields

    def rows(self, scores: list) -> list[list[float]]:
        """The request's rows from its answer's scores: one per item, or for a setwise
        request one per anchor of its one item (SGLang nests them: a matrix per item)."""
        if self.score_extraction_token is None:
            return scores
        (matrix,) = scores
        return matrix

    @property
    def one_token_labels(self) -> bool:
        """Every label is one token: what SGLang's /v1/score carries."""
        return all(isinstance(label, int) for label in self.label_token_ids)


@dataclass(frozen=True)
class ContinuationRequest:
    """Each continuation's token log-probabilities after ``query + item``."""

    query: str
    items: tuple[str, ...]
    continuations: tuple[str, ...]  # one per item
    lora_path: str | None = None  # the LoRA adapter it runs under (None: the base model)

    async def sent_to(self, continuation_logprobs):
        """The answer of a function with Engine.async_continuation_logprobs's signature."""
        adapter = {} if self.lora_path is None else {"lora_path": self.lora_path}
        return await continuation_logprobs(
            self.query, list(self.items), list(self.continuations), **adapter
        )


@dataclass(frozen=True)
class CompiledCall:
    """The requests for a call or batch; ``where[i]`` = (request, item) of input i."""

    requests: tuple[ScoreRequest | ContinuationRequest, ...]
    where: tuple[tuple[int, int], ...]

    def gather(self, answers: list[list[list[float]]]) -> list[list[float]]:
        """Per-input probability rows, in input order, from per-request answers."""
        return [answers[r][i] for r, i in self.where]


def group_requests(
    prompts: list[Prompt],
    label_ids: list[list],
    apply_softmax: bool,
    max_items: int | None,
    length_normalize: bool = False,
    temperature: float = 1.0,
    lora_path: str | None = None,
) -> CompiledCall:
    """Inputs sharing a prefix (and label ids) become the items of one request, at most
    ``max_items`` each (None: no limit), requests in order of first appearance. Inputs
    whose prefix no other input shares go together in one request instead of one each,
    their whole prompts as items of an empty query (SGLang scores query + item as one
    text, so the probabilities are the same, and its prefix cache matches tokens, not
    the split).

    The items of one request share its prefix; the engine's JCT scheduler computes it once
    (one item first, the others as cache hits), so nothing is sent ahead to warm the cache.
    Under SGLang's own FCFS policy (schedule_policy="fcfs", or a stock SGLang server) the
    items of one request are prefilled together and each computes the prefix again.
    """
    by_prefix: dict[tuple[str, tuple, tuple], list[int]] = {}
    for i, (prompt, ids) in enumerate(zip(prompts, label_ids)):
        if not prompt.text:
            raise InvalidRequestError(f"input {i}: the prompt is empty")
        key = (prompt.prefix, tuple(ids), tuple(_image_key(v) for v in prompt.images))
        by_prefix.setdefault(key, []).append(i)
    lone = Counter(ids for (prefix, ids, shown), m in by_prefix.items() if prefix and len(m) == 1)
    groups: dict[tuple[str, tuple, tuple], list[tuple[int, str]]] = {}
    for (prefix, ids, shown), members in by_prefix.items():
        if prefix and len(members) == 1 and lone[ids] > 1 and not shown:
            groups.setdefault(("", ids, ()), []).append((members[0], prompts[members[0]].text))
        else:
            groups.setdefault((prefix, ids, shown), []).extend(
                (i, prompts[i].item) for i in members
            )

    requests: list[ScoreRequest] = []
    where: list[tuple[int, int] | None] = [None] * len(prompts)
    for (prefix, ids, shown), members in groups.items():
        step = max_items or len(members)
        chunks = [members[start : start + step] for start in range(0, len(members), step)]
        for chunk in chunks:
            for position, (i, _) in enumerate(chunk):
                where[i] = (len(requests), position)
            items = tuple(item for _, item in chunk)
            own = tuple(prompts[i].item_images for i, _ in chunk)
            requests.append(
                ScoreRequest(
                    prefix,
                    items,
                    ids,
                    apply_softmax,
                    length_normalize,
                    temperature=temperature,
                    lora_path=lora_path,
                    images=prompts[chunk[0][0]].images if shown else (),
                    item_images=own if any(own) else None,
                )
            )
    return CompiledCall(requests=tuple(requests), where=tuple(where))


def _image_key(value):
    """What tells two prefixes' images apart: their bytes or text (a URL, a path); another
    object (a PIL image) by identity."""
    return value if isinstance(value, bytes | str) else ("object", id(value))


def group_continuations(prompts: list[Prompt], lora_path: str | None = None) -> CompiledCall:
    """Prompts sharing a prefix become the items of one ContinuationRequest (each with its
    continuation, all under the function's adapter), requests in order of first
    appearance."""
    groups: dict[str, list[int]] = {}
    for i, prompt in enumerate(prompts):
        if not prompt.text:
            raise InvalidRequestError(f"input {i}: the prompt is empty")
        if not prompt.continuation:
            raise InvalidRequestError(
                f"input {i}: the prompt has no continuation (a likelihood ranker scores "
                "Prompt(..., continuation=...))"
            )
        if prompt.images or prompt.item_images:  # a ContinuationRequest carries no image
            raise InvalidRequestError(
                f"input {i}: a likelihood ranker scores text only (its continuation's "
                "log-probabilities carry no images); rank images with a ranker of labels"
            )
        groups.setdefault(prompt.prefix, []).append(i)
    requests, where = [], [None] * len(prompts)
    for prefix, members in groups.items():
        for position, i in enumerate(members):
            where[i] = (len(requests), position)
        items = tuple(prompts[i].item for i in members)
        continuations = tuple(prompts[i].continuation for i in members)
        requests.append(ContinuationRequest(prefix, items, continuations, lora_path))
    return CompiledCall(requests=tuple(requests), where=tuple(where))
