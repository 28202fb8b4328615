"""Label sets and their compilation to label token ids (plain Python; a tokenizer is passed in).

A label set comes from a list, an ``Enum`` class or a ``Literal[...]`` annotation. Each label
has a *value* (what the user gets back: the list entry, the Enum member, the Literal value)
and a *text* (what the model should write: ``str(value)``, or an Enum member's value).

Compilation happens per tokenizer and per prompt ending, because SGLang scores
``query + item`` tokenized as one text, so the label token must be the token that would
follow *that* text:

- the prompt ends with whitespace (e.g. a chat template's "<|im_start|>assistant\\n"):
  the label is written as is ("good");
- otherwise ("Credit risk:") it is written with a leading space (" good");
- a label that starts with whitespace is taken verbatim; ``leading_space`` forces either.

A label is then the tokens that follow the tail's own tokens when the tail and the label
are tokenized together: one token (one forward scores it), or several (the product of
their conditional probabilities: scoring/label_trie.py). Where the two re-split at the boundary
(a newline run before a word, a word continued by the label), the label is its own
tokens after the prompt's: what the model writes when it generates from the prompt as
SGLang tokenizes it. A prompt ending in a space before a label without one is refused
(the model writes the space with the word). No two labels may be the same tokens.
Errors name the label and show how it tokenizes.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Iterable
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError

TAIL_CHARS = 32  # how much of the prompt's end is re-tokenized to check a label in context


LabelIds = int | tuple[int, ...]
"""One label's token ids: its id, or its ids when it is several tokens (JSON: a list)."""


class LabelError(InvalidRequestError):
    """A label set that cannot be scored: empty, duplicated, merging with the prompt's end,
    or colliding."""


@dataclass(frozen=True)
class LabelSet:
    values: tuple  # what results report: list entries, Enum members or Literal values
    texts: tuple[str, ...]  # what the model writes, before any leading space is added
    label_type: object  # the type of a result's label: a Literal[...] or the Enum class

    def __len__(self) -> int:
        return len(self.texts)

    def text_of(self, value) -> str:
        """The text of a label given as a value, an Enum member or a text."""
        for v, t in zip(self.values, self.texts):
            if value is v or value == v or value == t:
                return t
        raise LabelError(f"{value!r} is not one of the labels {list(self.texts)}")


NO_LABELS = LabelSet(values=(), texts=(), label_type=None)  # a likelihood ranker's


def label_set(labels) -> LabelSet:
    """A LabelSet from a list/tuple of str or int, an Enum class or a Literal[...] type.
    Raises LabelError for an empty set, a blank label or two labels with the same text."""
    if isinstance(labels, type) and issubclass(labels, enum.Enum):
        values = tuple(labels)
        texts = tuple(_enum_text(m) for m in values)
        label_type = labels
    elif typing.get_origin(labels) is typing.Literal:
        values = typing.get_args(labels)
        texts = tuple(_plain_text(v) for v in values)
        label_type = labels
    elif isinstance(labels, Iterable) and not isinstance(labels, str | bytes | dict):
        values = tuple(labels)
        texts = tuple(_plain_text(v) for v in values)
        label_type = typing.Literal[values] if values else None
    else:
        raise LabelError(
            f"labels must be a list of strings, an Enum class or a Literal[...] type, "
            f"got {labels!r}"
        )
    if not values:
        raise LabelError("the label set is empty: declare at least one label")
    for text in texts:
        if not text.strip():
            raise LabelError(f"label {text!r} is blank")
    duplicates = sorted({t for t in texts if texts.count(t) > 1})
    if duplicates:
        raise LabelError(f"labels must be distinct; repeated: {duplicates}")
    return LabelSet(values=values, texts=texts, label_type=label_type)


def _plain_text(value) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise LabelError(f"a label must be a string or an integer, got {value!r}")
    return str(value)


def _enum_text(member: enum.Enum) -> str:
    value = member.value
    plain = isinstance(value, str | int) and not isinstance(value, bool)
    return str(value) if plain else member.name


def label_form(text: str, prompt: str, leading_space: bool | None = None) -> str:
    """The text the label is tokenized as after ``prompt`` (see the module docstring)."""
    if leading_space is None:
        leading_space = not (text[:1].isspace() or prompt[-1:].isspace())
    return " " + text if leading_space and not text[:1].isspace() else text


def compile_labels(
    labels: LabelSet, tokenizer, prompt: str, leading_space: bool | None = None
) -> list[LabelIds]:
    """Per label, in label order, its token id (one token) or token-id tuple (several
    tokens) after a prompt ending like ``prompt``.

    Only the prompt's last TAIL_CHARS characters matter. Raises LabelError when a label
    merges with the prompt's end or two labels compile to the same tokens.
    """
    tail = prompt[-TAIL_CHARS:]
    base = _encode(tokenizer, tail)
    ids: list[LabelIds] = []
    for text in labels.texts:
        form = label_form(text, tail, leading_space)
        full = _encode(tokenizer, tail + form)
        if len(full) > len(base) and full[: len(base)] == base:
            new = full[len(base) :]  # the label's tokens in context
        elif not tail[-1:].isspace() or tail[-1:] in "\n\r":
            # The boundary re-splits (SmolLM2: "\n\n" then "yes" is "\n", "\n", "yes"):
            # the prompt keeps its own tokens, as SGLang scores it, and the label is its
            # own tokens after them, what the model writes when it generates from there.
            new = _encode(tokenizer, form)
        else:
            alone = _encode(tokenizer, form)
            raise LabelError(
                f"label {text!r} merges with the prompt's last characters {tail[-12:]!r}: "
                f"it is written {form!r} ({_show(tokenizer, alone)}), and in context the "
                f"prompt end and label tokenize as {_show(tokenizer, full[-len(alone) - 2 :])}: "
                "the model would write the space and the label as one token; end the prompt "
                "without the trailing space (the label then gets its leading space)"
            )
        ids.append(new[0] if len(new) == 1 else tuple(new))
    _check_collisions(labels, ids, tokenizer, tail, leading_space)
    return ids


def label_word_ids(tokenizer, words, prompts=("",)) -> list[LabelIds]:
    """Token ids of label words written verbatim (no space added) after each of
    ``prompts``, by the same compiler as the DSL's labels: for callers that give words
    rather than a declared label set (/v1/score_labels). Raises LabelError naming a word
    that merges with a prompt's end, or two words that are the same tokens."""
    labels = label_set(list(words) if isinstance(words, list | tuple) else words)
    ids: list[LabelIds] | None = None
    for tail in dict.fromkeys(prompt[-TAIL_CHARS:] for prompt in prompts):
        got = compile_labels(labels, tokenizer, tail, leading_space=False)
        if ids is not None and got != ids:
            raise LabelError(
                f"the labels {list(labels.texts)} are different tokens after different "
                f"prompts ({ids} and {got}); score those prompts in separate requests"
            )
        ids = got
    return ids


def _check_collisions(labels, ids, tokenizer, tail, leading_space) -> None:
    seen: dict[LabelIds, str] = {}
    for text, token in zip(labels.texts, ids):
        if token in seen:
            form = label_form(text, tail, leading_space)
            tokens = list(token) if isinstance(token, tuple) else [token]
            raise LabelError(
                f"labels {seen[token]!r} and {text!r} collide: both compile to "
                f"{_show(tokenizer, tokens)} (written {form!r}); give labels that "
                f"tokenize differently"
            )
        seen[token] = text


def _encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _show(tokenizer, ids: list[int]) -> str:
    pieces = tokenizer.convert_ids_to_tokens(ids)
    decoded = [tokenizer.decode([i]) for i in ids]
    return f"{len(ids)} token(s) {decoded} (tokens {pieces}, ids {ids})"
