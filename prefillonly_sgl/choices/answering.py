"""One choice answer, part by part (plain Python; the scoring is passed in).

The answer is written left to right: fixed text as its own tokens, each slot by scoring
its choices behind everything written so far (the prompt, then the answer's tokens:
each field conditioned on the JSON text before it) and picking one (selection.py). The
prompt and the answer's tokens are never re-tokenized together: a choice's tokens are
those the label compiler finds where it follows the text before it
(scoring/labels.compile_labels), as a model generating from there would write them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from prefillonly_sgl.choices import selection
from prefillonly_sgl.choices.selection import Step, Tokens
from prefillonly_sgl.choices.shapes import ChoiceShape, Fixed, Slot
from prefillonly_sgl.scoring.labels import TAIL_CHARS
from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len

# The prompt's last tokens, decoded: the text the first slot's choices are tokenized after
# (labels.TAIL_CHARS of it)
PROMPT_TAIL_TOKENS = 16

# score(answer tokens so far, choices' tokens) -> per choice, per token, its log-prob
Score = Callable[[list[int], Sequence[Tokens]], Awaitable[list[list[float]]]]
# choice_tokens(slot texts, the text right before them) -> each choice's tokens
ChoiceTokens = Callable[[Sequence[str], str], list[Tokens]]


@dataclass(frozen=True)
class FieldAnswer:
    slot: Slot
    chosen: int
    probabilities: list[float]  # per choice, selection.probabilities

    @property
    def by_key(self) -> dict[str, float]:
        return dict(zip(self.slot.keys, self.probabilities, strict=True))


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: list[int]  # the answer's tokens (fixed text and choices)
    steps: list[Step]  # one per answer token
    fields: list[FieldAnswer]

    def choice_probabilities(self) -> dict:
        """A plain choice's {choice: p}; a JSON object's {field: {choice: p}}, each
        field's conditioned on the answer before it."""
        if len(self.fields) == 1 and self.fields[0].slot.name is None:
            return self.fields[0].by_key
        return {f.slot.name: f.by_key for f in self.fields}


async def answer(
    shape: ChoiceShape,
    prompt_tail: str,
    score: Score,
    choice_tokens: ChoiceTokens,
    encode: Callable[[str], list[int]],
    end_token: int | None,
    sampling: Mapping,
    draw: str = "0",
) -> Answer:
    """The answer to one prompt. prompt_tail: the prompt's last characters (what the first
    slot's choices follow); end_token: what ends the answer (EOS), scored after a plain
    choice only when the choices are not prefix-free."""
    written: list[int] = []
    steps: list[Step] = []
    fields: list[FieldAnswer] = []
    texts: list[str] = []
    scored_first = False  # the next fixed text's first token was scored as a terminator
    for index, part in enumerate(shape.parts):
        if isinstance(part, Fixed):
            ids = encode(part.text)
            forced = ids[1:] if scored_first else ids
            steps += [Step(t, None, ((t, 0.0),)) for t in forced]
            written += ids
            texts.append(part.text)
            scored_first = False
            continue
        before = (prompt_tail + "".join(texts))[-TAIL_CHARS:]
        tokens = choice_tokens(part.texts, before)
        after = shape.fixed_after(index)
        terminator = encode(after)[0] if after else end_token
        scored, has_terminator = selection.terminated(tokens, terminator)
        logprobs = await score(list(written), scored)
        chosen = selection.pick(scored, logprobs, sampling, f"{draw}:{index}")
        chosen_steps = selection.steps(scored, logprobs, chosen)
        if has_terminator and not after:
            chosen_steps = chosen_steps[:-1]  # the end token is not part of the text
        scored_first = has_terminator and bool(after)
        steps += chosen_steps
        written += list(tokens[chosen])
        texts.append(part.texts[chosen])
        sequences = selection.sequence_logprobs(logprobs)
        fields.append(FieldAnswer(part, chosen, selection.probabilities(sequences)))
    return Answer("".join(texts), written, steps, fields)


def longest_answer_tokens(shape: ChoiceShape, encode: Callable[[str], list[int]]) -> int:
    """An estimate of the most tokens an answer can take (each choice tokenized alone):
    a request whose max_tokens is below it keeps SGLang's path, which truncates."""
    total = 0
    for part in shape.parts:
        if isinstance(part, Fixed):
            total += len(encode(part.text))
        else:
            total += max(len(encode(text)) for text in part.texts)
    return total


def query_len(prefix: Sequence[int], prompt: Sequence[int]) -> int:
    """How many of the prompt's first tokens each score call sends as its query (the rest
    of the prompt and the answer so far its item): the prompt's common prefix with its
    reusable prefix (the chat history, completions' shared_prefix), which the prefix
    cache keeps; one token at least is left to the item, which is never empty."""
    shared = common_prefix_len(prefix, prompt) if prefix else 0
    return min(shared, len(prompt) - 1)
