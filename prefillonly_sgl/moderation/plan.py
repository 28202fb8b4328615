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

    plan = plan_moderation(kind, prompts, n_inputs, encode)   # the rounds
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
    texts: Sequence[str], encode: Callable[[str], Ids], before: str = ""
) -> list[Ids]:
    """Each label text as token ids after `before`."""
    return [tokens_after(encode, before, text) for text in texts]


def code_extensions(
    codes: Sequence[str], encode: Callable[[str], Ids], before: str
) -> dict[str, tuple[str, ...]]:
    """Each code's nearest extensions: the codes whose tokens (after `before`) begin with
    all of its tokens, less those that extend one of them (with characters "S1" -> ("S10",
    "S11"); in Llama 3's tokens "S10" is "S", "10": nothing). A code's label is then the
    probability of its tokens; that of the code itself, written and not extended, is that
    less its extensions' (readout.first_of): no label needs the end of the turn, a
    special token, which SGLang's score API cannot read."""
    tokens = {c: tokens_after(encode, before, c) for c in codes}

    def extends(longer: str, shorter: str) -> bool:
        a, b = tokens[longer], tokens[shorter]
        return longer != shorter and len(a) > len(b) and a[: len(b)] == b

    out = {}
    for c in codes:
        longer = [o for o in codes if extends(o, c)]
        out[c] = tuple(o for o in longer if not any(extends(o, m) for m in longer))
    return out


@dataclass(frozen=True)
class ModerationPlan:
    kind: str  # "llama_guard_3", "qwen3guard", "yes_no"
    prompts: tuple[Prompt, ...]
    rounds: tuple[Round, ...]
    taxonomy: Taxonomy | None
    n_inputs: int
    verdicts: readout.Verdicts = readout.YES_NO_VERDICTS  # a yes_no plan's two answers
    codes: tuple[str, ...] = ()  # the categories the prompts list (a round 2's labels)
    code_texts: dict = field(default_factory=dict)  # {code: its label's text in round 2}
    code_extensions: dict = field(default_factory=dict)  # (code_extensions)

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

    def _first(self, row: dict) -> dict[str, float]:
        by_code = {c: row[self.code_texts[c]] for c in self.codes}
        return readout.first_of(self.code_extensions, by_code)

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
        codes = self.codes
        # the codes after each way of writing "unsafe", mixed by each way's probability
        ways = readout.LLAMA_GUARD_VERDICTS.ways["unsafe"]
        weights = [probs[w] for w in ways]
        mixed = {c: 0.0 for c in codes}
        total = sum(weights)
        for k, weight in enumerate(weights):
            share = self._first(second[i * len(ways) + k])
            for c in codes:
                mixed[c] += share[c] * (weight / total if total > 0 else 1.0 / len(ways))
        categories = readout.category_scores(verdict["unsafe"], mixed)
        return InputResult(verdict["unsafe"], categories, mass, verdict)

    def _read_qwen3guard(self, i, first, second) -> InputResult:
        verdict, mass = readout.verdict_probabilities(readout.QWEN3GUARD_VERDICTS, first[i])
        share = self._first(second[i])
        categories = readout.category_scores(verdict["Unsafe"], share)
        return InputResult(verdict["Unsafe"], categories, mass, verdict)


def plan_moderation(
    kind: str,
    prompts: Sequence[Prompt],
    n_inputs: int,
    encode: Callable[[str], Ids],
    taxonomy: Taxonomy | None = None,
    verdicts: readout.Verdicts = readout.YES_NO_VERDICTS,
    codes: Sequence[str] | None = None,
) -> ModerationPlan:
    """The rounds of a moderation call (module docstring). kind: "llama_guard_3",
    "qwen3guard" or "yes_no" (Granite Guardian's risks, a caller's policies); prompts:
    rendered, in input order (several per input for yes_no: one per policy); verdicts: a
    yes_no plan's answers (readout.YES_NO_VERDICTS after an assistant header,
    readout.POLICY_VERDICTS after the policy classifier's "Answer:"); codes: the categories
    the prompts list (default: the taxonomy's), read in round 2."""
    codes = tuple(codes if codes is not None else (taxonomy.codes() if taxonomy else ()))
    query, items = split_common([p.ids for p in prompts])
    if kind == "yes_no":
        texts = verdicts.texts()
        first = Round(query, items, texts, compile_texts(texts, encode))
        return ModerationPlan(kind, tuple(prompts), (first,), taxonomy, n_inputs, verdicts)
    if kind == "llama_guard_3":
        texts = readout.LLAMA_GUARD_VERDICTS.texts()
        first = Round(query, items, texts, compile_texts(texts, encode))
        ways = readout.LLAMA_GUARD_VERDICTS.ways["unsafe"]
        after = [way + readout.LLAMA_GUARD_AFTER_UNSAFE for way in ways]
        then = [item + encode(written) for item in items for written in after]
        # the codes' tokens after the (first) way: the ways differ only before "unsafe"
        code_texts = {c: c for c in codes}
        texts2 = list(codes)
        second = Round(query, then, texts2, compile_texts(texts2, encode, after[0]))
        return ModerationPlan(
            kind, tuple(prompts), (first, second), taxonomy, n_inputs, codes=codes,
            code_texts=code_texts, code_extensions=code_extensions(codes, encode, after[0]),
        )  # fmt: skip
    if kind == "qwen3guard":
        texts = readout.QWEN3GUARD_VERDICTS.texts()
        safety = readout.QWEN3GUARD_SAFETY
        asked = [item + encode(safety) for item in items]
        first = Round(query, asked, texts, compile_texts(texts, encode, safety))
        categories = readout.QWEN3GUARD_CATEGORIES
        then = [item + encode(categories) for item in items]
        code_texts = {c: " " + c for c in codes}  # "Categories: Violent"
        texts2 = [code_texts[c] for c in codes]
        second = Round(query, then, texts2, compile_texts(texts2, encode, categories))
        spaced = code_extensions(texts2, encode, categories)
        extensions = {c: tuple(o[1:] for o in spaced[" " + c]) for c in codes}
        return ModerationPlan(
            kind, tuple(prompts), (first, second), taxonomy, n_inputs, codes=codes,
            code_texts=code_texts, code_extensions=extensions,
        )  # fmt: skip
    raise ValueError(f"unknown guard kind {kind!r}")
