"""A moderation call as score requests (plain Python): which prompts, which labels, and
how their probabilities become each input's verdict and category scores.

Every input (a conversation) and every policy / risk it is checked against is one
prompt, rendered by the guard's own chat template (guard_prompts.py); the call's prompts go out
as ONE score request: their common token prefix is the query (Llama Guard: the category
list before each conversation; Granite Guardian and the policy classifier: the
conversation before each risk), each prompt's rest an item packed behind it (the JCT
scheduler and packing: one prefill of the shared part). Labels are the verdicts' texts
(readout.py), of several tokens by the chain rule, read as whole-vocabulary
probabilities (apply_softmax=False). A guard whose categories follow its verdict (Llama
Guard 3, Qwen3Guard) has a second round: each prompt followed by the flagging verdict,
the categories as labels: cache hits of the first round's prompts.

    plan = plan_moderation(guard, prompts, encode, eos_id)   # the rounds
    rows = [await score(r.query, r.items, r.labels) for r in plan.rounds]
    results = plan.read(rows)                                 # per input
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from prefillonly_sgl.moderation import readout
from prefillonly_sgl.moderation.taxonomies import Taxonomy
from prefillonly_sgl.scoring.reusable_prefix import common_prefix_len

Ids = list[int]


@dataclass(frozen=True)
class Prompt:
    """One rendered prompt: the input it checks and the policy / risk (None: the guard's
    whole taxonomy in one prompt), its token ids."""

    input_index: int
    policy: str | None
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Round:
    """One score request: the shared query, the items, the labels (token-id sequences,
    one per text in `texts`, same order)."""

    query: Ids
    items: list[Ids]
    texts: list[str]
    labels: list[Ids]


@dataclass(frozen=True)
class InputResult:
    """One input's reading: the flagging probability, each guard category's (or policy's)
    probability, the verdicts' label mass."""

    flagged_probability: float
    categories: dict[str, float]
    label_mass: float
    verdicts: dict[str, float] = field(default_factory=dict)


def split_common(prompts: Sequence[Sequence[int]]) -> tuple[Ids, list[Ids]]:
    """(the prompts' common prefix, each prompt's rest), at least one token left in every
    rest (an item is never empty)."""
    first = list(prompts[0])
    n = len(first)
    for p in prompts[1:]:
        n = min(n, common_prefix_len(first, p))
    n = min(n, min(len(p) for p in prompts) - 1)
    n = max(n, 0)
    return first[:n], [list(p[n:]) for p in prompts]


def tokens_after(encode: Callable[[str], Ids], before: str, text: str) -> Ids:
    """`text`'s tokens as the model writes them after `before` (both its own output): the
    tokens of before + text past those of before where they extend them (a boundary the
    tokenizer merges keeps its merge), else `text` alone."""
    if not before:
        return encode(text)
    head, whole = encode(before), encode(before + text)
    if whole[: len(head)] == head and len(whole) > len(head):
        return whole[len(head) :]
    return encode(text)


def compile_texts(
    texts: Sequence[str], encode: Callable[[str], Ids], eos_id: int | None, before: str = ""
) -> list[Ids]:
    """Each label text as token ids after `before`; a text ending in END_OF_TURN ends with
    `eos_id` (the end of the assistant's turn)."""
    labels = []
    for text in texts:
        if text.endswith(END_OF_TURN):
            if eos_id is None:
                raise ValueError("this guard's labels need the tokenizer's end-of-turn token")
            body = text[: -len(END_OF_TURN)]
            labels.append([*(tokens_after(encode, before, body) if body else []), eos_id])
        else:
            labels.append(tokens_after(encode, before, text))
    return labels


END_OF_TURN = "\x00<eot>"  # marks "the end of the assistant's turn" in a label text


@dataclass(frozen=True)
class ModerationPlan:
    kind: str  # "llama_guard_3", "qwen3guard", "yes_no"
    prompts: tuple[Prompt, ...]
    rounds: tuple[Round, ...]
    taxonomy: Taxonomy | None
    n_inputs: int
    verdicts: readout.Verdicts = readout.YES_NO_VERDICTS  # a yes_no plan's two answers

    def read(self, rows: Sequence[Sequence[Sequence[float]]]) -> list[InputResult]:
        """Each input's result from each round's rows (per item, per label, the label's
        whole-vocabulary probability)."""
        first = [dict(zip(self.rounds[0].texts, row, strict=True)) for row in rows[0]]
        if self.kind == "yes_no":
            return self._read_yes_no(first)
        second = [dict(zip(self.rounds[1].texts, row, strict=True)) for row in rows[1]]
        if self.kind == "llama_guard_3":
            return [self._read_llama_guard(i, first, second) for i in range(self.n_inputs)]
        return [self._read_qwen3guard(i, first, second) for i in range(self.n_inputs)]

    def _read_yes_no(self, first) -> list[InputResult]:
        results = []
        for i in range(self.n_inputs):
            categories, masses = {}, []
            for prompt, probs in zip(self.prompts, first, strict=True):
                if prompt.input_index != i:
                    continue
                verdict, mass = readout.verdict_probabilities(self.verdicts, probs)
                categories[prompt.policy] = verdict["Yes"]
                masses.append(mass)
            flagged = max(categories.values()) if categories else 0.0
            results.append(InputResult(flagged, categories, min(masses) if masses else 0.0))
        return results

    def _read_llama_guard(self, i, first, second) -> InputResult:
        probs = first[i]
        verdict, mass = readout.verdict_probabilities(readout.LLAMA_GUARD_VERDICTS, probs)
        codes = self.taxonomy.codes()
        # the codes after each way of writing "unsafe", mixed by each way's probability
        ways = readout.LLAMA_GUARD_VERDICTS.ways["unsafe"]
        weights = [probs[w] for w in ways]
        mixed = {c: 0.0 for c in codes}
        total = sum(weights)
        for k, weight in enumerate(weights):
            share = readout.first_of(codes, LLAMA_GUARD_CODE_ENDS, second[i * len(ways) + k])
            for c in codes:
                mixed[c] += share[c] * (weight / total if total > 0 else 1.0 / len(ways))
        categories = readout.category_scores(verdict["unsafe"], mixed)
        return InputResult(verdict["unsafe"], categories, mass, verdict)

    def _read_qwen3guard(self, i, first, second) -> InputResult:
        verdict, mass = readout.verdict_probabilities(readout.QWEN3GUARD_VERDICTS, first[i])
        names = self.taxonomy.codes()
        share = readout.first_of(names, QWEN3GUARD_NAME_ENDS, second[i])
        categories = readout.category_scores(verdict["Unsafe"], share)
        return InputResult(verdict["Unsafe"], categories, mass, verdict)


LLAMA_GUARD_CODE_ENDS = (",", END_OF_TURN)
QWEN3GUARD_NAME_ENDS = ("\n", ",", END_OF_TURN)


def plan_moderation(
    kind: str,
    prompts: Sequence[Prompt],
    n_inputs: int,
    encode: Callable[[str], Ids],
    eos_id: int | None,
    taxonomy: Taxonomy | None = None,
    verdicts: readout.Verdicts = readout.YES_NO_VERDICTS,
) -> ModerationPlan:
    """The rounds of a moderation call (module docstring). kind: "llama_guard_3",
    "qwen3guard" or "yes_no" (Granite Guardian's risks, a caller's policies); prompts:
    rendered, in input order (several per input for yes_no: one per policy); verdicts: a
    yes_no plan's answers (readout.YES_NO_VERDICTS after an assistant header,
    readout.POLICY_VERDICTS after the policy classifier's "Answer:")."""
    query, items = split_common([p.ids for p in prompts])
    if kind == "yes_no":
        texts = verdicts.texts()
        first = Round(query, items, texts, compile_texts(texts, encode, eos_id))
        return ModerationPlan(kind, tuple(prompts), (first,), taxonomy, n_inputs, verdicts)
    if kind == "llama_guard_3":
        texts = readout.LLAMA_GUARD_VERDICTS.texts()
        first = Round(query, items, texts, compile_texts(texts, encode, eos_id))
        ways = readout.LLAMA_GUARD_VERDICTS.ways["unsafe"]
        after = [way + readout.LLAMA_GUARD_AFTER_UNSAFE for way in ways]
        then = [item + encode(written) for item in items for written in after]
        codes = [c + end for c in taxonomy.codes() for end in LLAMA_GUARD_CODE_ENDS]
        # the codes' tokens after the (first) way: the ways differ only before "unsafe"
        second = Round(query, then, codes, compile_texts(codes, encode, eos_id, after[0]))
        return ModerationPlan(kind, tuple(prompts), (first, second), taxonomy, n_inputs)
    if kind == "qwen3guard":
        texts = readout.QWEN3GUARD_VERDICTS.texts()
        safety = readout.QWEN3GUARD_SAFETY
        asked = [item + encode(safety) for item in items]
        first = Round(query, asked, texts, compile_texts(texts, encode, eos_id, safety))
        categories = readout.QWEN3GUARD_CATEGORIES
        then = [item + encode(categories) for item in items]
        names = [" " + c + end for c in taxonomy.codes() for end in QWEN3GUARD_NAME_ENDS]
        labels = compile_texts(names, encode, eos_id, categories)
        second = Round(query, then, [n[1:] for n in names], labels)
        return ModerationPlan(kind, tuple(prompts), (first, second), taxonomy, n_inputs)
    raise ValueError(f"unknown guard kind {kind!r}")
