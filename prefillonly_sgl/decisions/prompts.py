"""How a decision is worded and where it sits in the model's prompt (plain Python; the
tokenizer is passed in).

One prompt per question (and per option order or content-free state, when asked):

    <chat template: the state's messages ... the last user message's text>\\n\\n
    <the question block>
    <the template's end of that message and its assistant turn>

The state's part is the same in every question's prompt: it is the reusable prefix,
computed once and found in the prefix cache by every other question, and by later
requests about the same state. `render_state` splits the rendered template at the
question's place, so the state is rendered once, whatever the template.

The question block (version 1 of the wording, shared with SGLang's /v1/decisions v1):

    predicate  Is the following true? <instructions>      labels: yes, no
               yes: <true description>   (when given)
               no: <false description>   (when given)
               Answer with yes or no only.
    choice     Question: <instructions>                    labels: the options' names
               Options:                                     ("letters": A, B, ... Z, AA, AB)
               - <name>: <description>
               Answer with the name of one option only.
    score      Question: <instructions>                    labels: 0, 1, ... n-1
               0: <level> - <description>
               Answer with the number of one level only.

"letters" is SGLang's v1 wording (`A: <name> - <description>`, "Answer with the letter of
one option only."), used for SGLang-shaped requests so their prompts are SGLang's.

A model without a chat template gets the plain template: each message's text in order
(system and assistant messages prefixed "System: " / "Assistant: "), blank lines between,
the question block after the last user text, then "Answer:"; labels then follow a space.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from prefillonly_sgl.decisions.call import DecisionCall, Message, Question, Wording
from prefillonly_sgl.scoring.errors import InvalidRequestError

_SENTINEL = "\u2063decision-question-slot\u2063"
_REPLY = "\u2063decision-answer-slot\u2063"
PLAIN_ANSWER_CUE = "\nAnswer:"


@dataclass(frozen=True)
class StateTemplate:
    """A state rendered around the question's place: prefix + block + suffix is a
    question's whole prompt text."""

    prefix: str
    suffix: str
    add_special_tokens: bool  # the plain template lets the tokenizer add BOS
    chat: bool  # rendered by the model's chat template

    def prompt(self, block: str) -> str:
        return f"{self.prefix}{block}{self.suffix}"


def letter_code(position: int) -> str:
    """A, B, ... Z, then AA, AB, ... (SGLang's labels past 26 options)."""
    letters = string.ascii_uppercase
    if position < 26:
        return letters[position]
    position -= 26
    return letters[position // 26] + letters[position % 26]


def question_block(question: Question, order: tuple[int, ...], wording: Wording) -> str:
    """The question's text with its options listed in ``order`` (indices into
    question.options)."""
    options = [question.options[j] for j in order]
    head = f"Question: {question.instructions}" if question.instructions else None
    if question.kind == "predicate":
        lines = [
            f"Is the following true? {question.instructions}"
            if question.instructions
            else "Is the following true?"
        ]
        lines += [f"{o.text}: {o.description}" for o in options if o.description]
        lines.append("Answer with yes or no only.")
    elif question.kind == "choice":
        lines = [head] if head else []
        if wording == "letters":
            for k, o in enumerate(options):
                code = letter_code(k)
                lines.append(
                    f"{code}: {o.text} - {o.description}" if o.description else f"{code}: {o.text}"
                )
            lines.append("Answer with the letter of one option only.")
        else:
            lines.append("Options:")
            lines += [
                f"- {o.text}: {o.description}" if o.description else f"- {o.text}" for o in options
            ]
            lines.append("Answer with the name of one option only.")
    else:
        lines = [head] if head else []
        for k, o in zip(order, options):
            level = f"{o.text} - {o.description}" if o.description else o.text
            lines.append(f"{k}: {level}")
        lines.append("Answer with the number of one level only.")
    return "\n".join(lines)


def label_texts(question: Question, order: tuple[int, ...], wording: Wording) -> list[str]:
    """Per option, in the question's own order, what the model writes to choose it when
    the options are listed in ``order``."""
    if question.kind == "predicate":
        return ["yes", "no"]
    if question.kind == "score":
        return [str(j) for j in range(len(question.options))]
    if wording == "letters":
        position = {j: k for k, j in enumerate(order)}
        return [letter_code(position[j]) for j in range(len(question.options))]
    return [o.text for o in question.options]


def render_state(tokenizer, messages: tuple[Message, ...], template_kwargs: dict) -> StateTemplate:
    """The state's messages rendered once, split where each question goes (after the last
    user message's text, or in a user message of its own when the state ends otherwise)."""
    if getattr(tokenizer, "chat_template", None):
        return _chat_state(tokenizer, messages, template_kwargs)
    return _plain_state(messages)


def _with_question_slot(messages: tuple[Message, ...], slot: str) -> list[dict]:
    rendered = [{"role": m.role, "content": m.content} for m in messages]
    if rendered and rendered[-1]["role"] == "user":
        text = rendered[-1]["content"]
        rendered[-1]["content"] = f"{text}\n\n{slot}" if text else slot
    else:
        rendered.append({"role": "user", "content": slot})
    return rendered


def _apply(tokenizer, messages: list[dict], template_kwargs: dict, generation: bool) -> str:
    # Thinking off, as SGLang's decisions do: the answer is the assistant's first token.
    kwargs = {"enable_thinking": False, **template_kwargs}
    try:
        return tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation, **kwargs
        )
    except Exception as e:  # jinja2's TemplateError and what templates raise themselves
        raise InvalidRequestError(f"input: the model's chat template refused the state: {e}") from e


def _chat_state(tokenizer, messages: tuple[Message, ...], template_kwargs: dict) -> StateTemplate:
    text = _apply(tokenizer, _with_question_slot(messages, _SENTINEL), template_kwargs, True)
    if text.count(_SENTINEL) != 1:
        raise InvalidRequestError(
            "input: the model's chat template does not keep the user message's text as "
            "it is, so the questions cannot share the state's prompt"
        )
    prefix, suffix = text.split(_SENTINEL)
    return StateTemplate(prefix=prefix, suffix=suffix, add_special_tokens=False, chat=True)


def _plain_state(messages: tuple[Message, ...]) -> StateTemplate:
    names = {"system": "System: ", "assistant": "Assistant: ", "user": ""}
    parts = [f"{names[m.role]}{m.content}" for m in messages if m.content]
    prefix = "".join(f"{part}\n\n" for part in parts)
    return StateTemplate(
        prefix=prefix, suffix=PLAIN_ANSWER_CUE, add_special_tokens=True, chat=False
    )


def end_of_answer(tokenizer, template: StateTemplate, template_kwargs: dict) -> str:
    """What the model writes after a whole answer: the chat template's end of an
    assistant turn, or a newline. Appended to an option's label when another option's
    label begins with its tokens, so the options stay exclusive."""
    if template.chat:
        try:
            text = _apply(
                tokenizer,
                [{"role": "user", "content": "?"}, {"role": "assistant", "content": _REPLY}],
                template_kwargs,
                False,
            )
        except InvalidRequestError:
            text = ""
        after = text.split(_REPLY, 1)[1] if _REPLY in text else ""
        if after.strip():
            return after
        eos = getattr(tokenizer, "eos_token", None)
        if eos:
            return eos
    return "\n"


@dataclass(frozen=True)
class PromptSlot:
    """One prompt the plan asks for: a question, its options' order, the state it follows
    (an index into the states passed to render_prompts)."""

    question: int
    order: tuple[int, ...]
    state: int


@dataclass(frozen=True)
class Rendering:
    """Every text of a call's prompts, rendered in one pass."""

    templates: tuple[StateTemplate, ...]  # per state
    end_of_answer: str  # what follows an answer in the call's own state's template
    texts: tuple[str, ...]  # per slot: the whole prompt
    label_texts: tuple[tuple[str, ...], ...]  # per slot: each option's label, in its order


def render_prompts(
    tokenizer, call: DecisionCall, states: list[tuple[Message, ...]], slots: list[PromptSlot]
) -> Rendering:
    """The texts of every slot's prompt: each state rendered once with the chat template
    and split at the question's place, each question's block put there."""
    templates = tuple(render_state(tokenizer, s, call.chat_template_kwargs) for s in states)
    blocks: dict[tuple, tuple[str, tuple[str, ...]]] = {}  # one per question and order
    texts, labels = [], []
    for slot in slots:
        key = (slot.question, slot.order)
        if key not in blocks:
            question = call.questions[slot.question]
            blocks[key] = (
                question_block(question, slot.order, call.wording),
                tuple(label_texts(question, slot.order, call.wording)),
            )
        block, label_words = blocks[key]
        texts.append(templates[slot.state].prompt(block))
        labels.append(label_words)
    return Rendering(
        templates=templates,
        end_of_answer=end_of_answer(tokenizer, templates[0], call.chat_template_kwargs),
        texts=tuple(texts),
        label_texts=tuple(labels),
    )
