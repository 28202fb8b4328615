"""A decision call compiled to score requests (plain Python; the tokenizer is passed in).

Every question becomes an item behind one computed state:
- the state is rendered once (prompts.render_state) and its token ids are the query of
  every score request of the call, so the prefix cache holds it after the first prompt
  and each other question computes only its own tokens (and a later call on the same
  state finds it cached);
- each question's prompt is tokenized whole, as a transformers forward of the same text
  would be, and the query is the longest token prefix all of them share (the state, and
  the questions' first words where they begin alike);
- each option's label is its own token ids after the prompt (scoring/labels.py's compiler:
  any number of tokens, scored by the chain rule); an option whose label is the start of
  another's gets the end of the answer after it (the template's end of turn), so the
  options stay exclusive events;
- questions with the same labels go out as one score request (all yes/no questions of a
  call are one request); extra prompts, when asked for, go out the same way: the other
  option orders (debiasing) behind the same state, and the content-free states
  (calibration) behind their own.

A state with images (a vision-language model; state_images.py put the model's image
placeholder in its text) is sent as text, the state's rendered prefix its query and each
question's rest its item, with the images beside every item: the model's processor
expands each placeholder, so token ids of the text would not be the prompt. Its lengths
here count the placeholders' text, not the images' tokens (SGLang refuses a prompt past
the context itself).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from prefillonly_sgl.decisions.call import DecisionCall, Message, Question
from prefillonly_sgl.decisions.prompts import PromptSlot, render_prompts
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.labels import LabelError, compile_labels, label_set
from prefillonly_sgl.scoring.priors import CONTENT_FREE
from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len

Ids = tuple[int, ...]


@dataclass(frozen=True)
class PlannedPrompt:
    question: int  # index into call.questions
    order: tuple[int, ...]  # the options as listed in this prompt
    state: int  # 0: the call's state; 1..: the content-free states, in CONTENT_FREE order
    ids: Ids
    labels: tuple[Ids, ...]  # per option, in the question's own order


@dataclass(frozen=True)
class ScoreGroup:
    """One score request: prompts sharing a state and labels."""

    query: list[int] | str  # text with images
    items: list[list[int]] | list[str]
    labels: list[list[int]]
    prompts: list[int]  # indices into DecisionPlan.prompts, one per item
    image_data: list[list[bytes]] | None = None  # per item the state's images, or None


@dataclass(frozen=True)
class DecisionPlan:
    call: DecisionCall
    prompts: tuple[PlannedPrompt, ...]
    groups: tuple[ScoreGroup, ...]
    state_tokens: int  # the query length of the call's own state
    refusals: dict[int, str] = field(default_factory=dict)  # question -> why refused


def option_orders(question: Question, debias: str) -> list[tuple[int, ...]]:
    """The option orders a question is asked in: as given; with "reverse" also reversed;
    with "cyclic" every rotation (each option once in every position). Debiasing applies
    to choice questions (a scale's and yes/no's order carry meaning)."""
    n = len(question.options)
    given = tuple(range(n))
    if question.kind != "choice" or debias == "none":
        return [given]
    if debias == "reverse":
        return [given, given[::-1]]
    return [given[r:] + given[:r] for r in range(n)]


def content_free_state(messages: tuple[Message, ...], text: str) -> tuple[Message, ...]:
    """The state with what the user said replaced by a content-free text (the system
    messages kept): the prior's context."""
    return tuple(Message(m.role, text) if m.role == "user" else m for m in messages)


def shared_prefix_len(state_ids: Sequence[int], prompts: list[list[int]]) -> int:
    """The query's length: the tokens every prompt begins with (the state, and whatever
    the questions begin with alike: "Is the following true? Does the"; for one prompt,
    the state's tokens as they tokenize in context), never a whole prompt (an item is
    not empty)."""
    first = prompts[0]
    if len(prompts) > 1:
        shared = min(common_prefix_len(first, p) for p in prompts[1:])
    else:
        shared = common_prefix_len(state_ids, first)
    return min(shared, min(len(p) for p in prompts) - 1)


class _Labels:
    """Label token ids per (label texts, prompt tail), compiled once per call."""

    def __init__(self, tokenizer, end_ids: Ids) -> None:
        self.tokenizer = tokenizer
        self.end_ids = end_ids
        self._cache: dict[tuple, tuple[Ids, ...]] = {}

    def __call__(self, question: Question, texts: list[str], tail: str) -> tuple[Ids, ...]:
        key = (tuple(texts), tail)
        if key not in self._cache:
            self._cache[key] = self._compile(question, texts, tail)
        return self._cache[key]

    def _compile(self, question: Question, texts: list[str], tail: str) -> tuple[Ids, ...]:
        try:
            compiled = compile_labels(label_set(texts), self.tokenizer, tail)
        except LabelError as e:
            raise InvalidRequestError(f"{question.where}: {e}") from e
        labels = [(c,) if isinstance(c, int) else tuple(c) for c in compiled]
        # A label that starts another is followed by the end of the answer: "1" and "12",
        # "yes" and "yes, partly" are then different answers, not one inside the other.
        return tuple(
            label + self.end_ids[:1]
            if any(len(o) > len(label) and o[: len(label)] == label for o in labels)
            else label
            for label in labels
        )


def plan_decision(
    call: DecisionCall, tokenizer, max_prompt_tokens: int, images: list[bytes] | None = None
) -> DecisionPlan:
    """The score requests that answer ``call``. InvalidRequestError names the field of
    anything that cannot be asked (a state past the context, labels that collide).
    images: the state's images, loaded (state_images.py), when it has some.

    One pass: which prompts the call asks (states, option orders), their texts rendered
    at once (prompts.render_prompts), then tokenized, labelled and grouped here."""
    if call.images and images is None:
        raise InvalidRequestError(
            f"{call.images[0][0]}: this door does not read a decision's images (a server's "
            "/v1/decisions and /v1/systemone read them on a vision-language model)"
        )
    states = [call.messages]
    if call.calibrate:
        states += [content_free_state(call.messages, text) for text in CONTENT_FREE]
    slots = [
        PromptSlot(q, order, s)
        for q, question in enumerate(call.questions)
        for order in option_orders(question, call.debias)
        for s in range(len(states))
    ]
    rendering = render_prompts(tokenizer, call, states, slots)
    end_ids = tuple(tokenizer.encode(rendering.end_of_answer, add_special_tokens=False)) or (
        (tokenizer.eos_token_id,) if tokenizer.eos_token_id is not None else ()
    )
    labels_of = _Labels(tokenizer, end_ids)
    labels = [
        labels_of(call.questions[slot.question], list(rendering.label_texts[i]), text[-32:])
        for i, (slot, text) in enumerate(zip(slots, rendering.texts))
    ]

    prompts: list[PlannedPrompt] = []
    texts: list[str] = []  # per planned prompt, its whole text
    queries: dict[int, list[int]] = {}
    for s, template in enumerate(rendering.templates):
        mine = [i for i, slot in enumerate(slots) if slot.state == s]
        texts = [rendering.texts[i] for i in mine]
        encoded = _encode_all(tokenizer, texts, template.add_special_tokens)
        state_ids = _encode_all(tokenizer, [template.prefix], template.add_special_tokens)[0]
        if s == 0 and common_prefix_len(state_ids, encoded[0]) >= max_prompt_tokens:
            raise InvalidRequestError(
                f"input: the state is {len(state_ids)} tokens; this server scores prompts of "
                f"at most {max_prompt_tokens} tokens (its context), questions included"
            )
        queries[s] = list(encoded[0][: shared_prefix_len(state_ids, encoded)])
        for i, ids in zip(mine, encoded):
            slot = slots[i]
            prompts.append(PlannedPrompt(slot.question, slot.order, s, tuple(ids), labels[i]))
            texts.append(rendering.texts[i])

    refusals: dict[int, str] = {}
    for p in prompts:
        longest = len(p.ids) + max(len(label) for label in p.labels) - 1
        if longest > max_prompt_tokens and p.question not in refusals:
            refusals[p.question] = (
                f"the question's prompt and longest answer are {longest} tokens, past "
                f"the {max_prompt_tokens} this server scores"
            )

    by_key: dict[tuple, ScoreGroup] = {}
    for i, p in enumerate(prompts):
        if p.question in refusals:
            continue
        group = by_key.get((p.state, p.labels))
        if group is None:
            as_text = bool(images) and p.state == 0  # content-free states hold no image
            group = by_key[(p.state, p.labels)] = ScoreGroup(
                query=rendering.templates[0].prefix if as_text else queries[p.state],
                items=[],
                labels=[list(x) for x in p.labels],
                prompts=[],
                image_data=[] if as_text else None,
            )
        if group.image_data is not None:
            group.items.append(texts[i][len(group.query) :])
            group.image_data.append(list(images))
        else:
            group.items.append(list(p.ids[len(group.query) :]))
        group.prompts.append(i)
    return DecisionPlan(
        call=call,
        prompts=tuple(prompts),
        groups=tuple(by_key.values()),
        state_tokens=len(queries[0]),
        refusals=refusals,
    )


def _encode_all(tokenizer, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
    """Token ids of each text, tokenized whole (a fast tokenizer encodes the batch in
    parallel)."""
    if getattr(tokenizer, "is_fast", False):
        return [
            list(ids)
            for ids in tokenizer(texts, add_special_tokens=add_special_tokens)["input_ids"]
        ]
    return [list(tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]
