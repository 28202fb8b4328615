"""What classifiers and rankers share: turning validated arguments into prompts, the label
token ids for each and the score requests for all (plain Python: the tokenizer comes from
the backend)."""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import typing

from prefillonly_sgl.dsl.prompt import ChatFormat, Prompt
from prefillonly_sgl.dsl.request import CompiledCall, group_continuations, group_requests
from prefillonly_sgl.dsl.signature import DeclarationError, Signature, type_hints
from prefillonly_sgl.scoring.adapters import check_lora_path
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.labels import (
    NO_LABELS,
    TAIL_CHARS,
    LabelIds,
    LabelSet,
    compile_labels,
    label_set,
)

RESERVED = ("engine",)  # call keywords every decorated function takes
_LABEL_CACHE_SIZE = 1024


def labels_from(fn, labels) -> LabelSet:
    """The label set given to the decorator, else the function's return annotation."""
    if labels is NO_LABELS:
        return labels
    if labels is None:
        labels = type_hints(fn).get("return")
        is_enum = isinstance(labels, type) and issubclass(labels, enum.Enum)
        if not (is_enum or typing.get_origin(labels) is typing.Literal):
            raise DeclarationError(
                f"{fn.__qualname__}: no labels: pass labels=[...] to the decorator, or "
                f"annotate the return type as Literal[...] or an Enum"
            )
    return label_set(labels)


class ScoringFunction:
    """A decorated prompt function with its labels, chat option and input validation."""

    kind = "function"  # "classifier" / "ranker": what its typed endpoint is
    scores_continuation = False  # True: a likelihood ranker (rows: continuation logprobs)

    def __init__(
        self,
        fn,
        labels,
        *,
        chat: bool,
        system: str | None,
        leading_space: bool | None,
        normalize: bool,
        length_normalize: bool = False,
        temperature: float = 1.0,
        reserved: tuple[str, ...],
        exclude: tuple[str, ...] = (),
        path: str | None = None,
        lora_path: str | None = None,
    ) -> None:
        if system is not None and not chat:
            raise DeclarationError(f"{fn.__qualname__}: system= needs chat=True")
        path = f"/apps/{fn.__name__}" if path is None else path
        if not path.startswith("/") or path.endswith("/") or " " in path:
            raise DeclarationError(
                f"{fn.__qualname__}: path={path!r} must start with '/' and not end with one"
            )
        self.path = path  # its typed endpoint under `prefillonly serve --app` (endpoint.py)
        self.fn = fn
        self.labels = labels_from(fn, labels)
        self.chat = ChatFormat(system) if chat else None
        self.leading_space = leading_space
        self.normalize = normalize
        self.length_normalize = length_normalize  # per-token probability of a label
        self.temperature = _checked_temperature(temperature, normalize, fn.__qualname__)
        try:
            self.lora_path = check_lora_path(lora_path)  # its adapter (None: the base model)
        except ValueError as e:
            raise DeclarationError(f"{fn.__qualname__}: {e}") from None
        self.inputs = Signature(fn, reserved=reserved, exclude=exclude)
        self._label_ids: dict[tuple[int, str], tuple[object, list[LabelIds]]] = {}
        functools.update_wrapper(self, fn)

    def prompt(self, tokenizer=None, /, **arguments) -> Prompt:
        """The function's prompt for validated ``arguments``, chat-formatted when declared
        with chat=True (which needs the tokenizer)."""
        return self.as_prompt(self.fn(**arguments), tokenizer)

    def as_prompt(self, value, tokenizer=None) -> Prompt:
        """What the function returned as a Prompt (chat-formatted when declared so)."""
        if isinstance(value, str):
            value = Prompt(item=value)
        elif not isinstance(value, Prompt):
            raise InvalidRequestError(
                f"{self.fn.__qualname__} must return a str or a prefillonly Prompt, "
                f"got {type(value).__name__}"
            )
        if self.chat is not None:
            if tokenizer is None:
                raise InvalidRequestError("chat=True: a tokenizer is needed to render the prompt")
            value = self.chat.render(value, tokenizer)
        return value

    def label_ids(self, tokenizer, prompt: Prompt) -> list[LabelIds]:
        """Label token ids after this prompt (cached per tokenizer and prompt ending): per
        label a token id, or a tuple of them for a label of several tokens."""
        tail = prompt.text[-TAIL_CHARS:]
        key = (id(tokenizer), tail)
        cached = self._label_ids.get(key)
        if cached is not None and cached[0] is tokenizer:
            return cached[1]
        ids = compile_labels(self.labels, tokenizer, tail, self.leading_space)
        if len(self._label_ids) >= _LABEL_CACHE_SIZE:
            self._label_ids.clear()
        self._label_ids[key] = (tokenizer, ids)  # keeps the tokenizer alive: ids stay unique
        return ids

    def compile_arguments(
        self,
        tokenizer,
        arguments: list[dict],
        max_items: int | None,
        head: bool = False,
        images: tuple | None = None,
    ) -> CompiledCall:
        """The score requests for validated ``arguments`` (one dict per prompt): prompts
        sharing a prefix share a request, at most ``max_items`` items each (None: no
        limit); see request.group_requests. head: for a model with a classification head,
        requests without labels (its classes answer: head_route.py). images: (the call's
        images for every prefix, per prompt its own or None), after each prompt's own."""
        prompts = [self.prompt(tokenizer, **a) for a in arguments]
        if images is not None:
            prompts = with_call_images(prompts, *images)
        if self.scores_continuation:
            return group_continuations(prompts, self.lora_path)
        if any(p.continuation for p in prompts):
            raise InvalidRequestError(
                f"{self.fn.__qualname__} returned a Prompt with a continuation: only a "
                "likelihood ranker (@ranker(method='likelihood')) scores one"
            )
        if head:
            label_ids = [()] * len(prompts)
        else:
            label_ids = [self.label_ids(tokenizer, p) for p in prompts]
        return group_requests(
            prompts,
            label_ids,
            self.normalize,
            max_items,
            self.length_normalize,
            self.temperature,
            self.lora_path,
        )


def with_call_images(prompts: list[Prompt], shared: tuple, own: tuple | None) -> list[Prompt]:
    """The prompts with a call's images added: ``shared`` to every prefix's, and each
    prompt's ``own`` to its item's."""
    own = own if own is not None else ((),) * len(prompts)
    return [
        dataclasses.replace(
            p, images=p.images + tuple(shared), item_images=p.item_images + tuple(mine)
        )
        for p, mine in zip(prompts, own, strict=True)
    ]


def _checked_temperature(temperature, normalize: bool, name: str) -> float:
    """A declaration's temperature: a finite number > 0, and other than 1 only with
    normalize=True (it divides the labels' log-probabilities before their softmax)."""
    t = temperature
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        raise DeclarationError(f"{name}: temperature must be a finite number > 0, got {t!r}")
    if t != 1.0 and not normalize:
        raise DeclarationError(
            f"{name}: temperature needs normalize=True (it scales the softmax over the labels)"
        )
    return float(t)
