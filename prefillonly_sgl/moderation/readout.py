"""How a guard's verdict is read by scoring, never decoded (plain Python).

Every guard writes its verdict as text after its prompt; the probability of each possible
verdict is the probability of that text, by the chain rule over its tokens, read off the
prefill (labels of several tokens: scoring/label_trie.py). A verdict the model may write
in more than one way is the sum of its ways; the verdicts are then normalised among
themselves, and what the model puts on them at all is reported as the label mass
(decisions/ does the same).

- Llama Guard 3: "safe" or "unsafe" right after the assistant header; the model may write
  a "\\n\\n" first (reported on its card's discussions), so each verdict has two ways.
  After "unsafe\\n" it writes the first violated category's code ("S1", "S10", ...; in
  Llama 3's tokens "S" then "1" or "10": a code whose tokens begin another's is read with
  what follows it, "," or "\\n").
  A category's score is P(unsafe) x P(it is the first code | unsafe): the category the
  model would name first.
- Qwen3Guard-Gen: after "Safety:", one of " Safe", " Unsafe", " Controversial"; after
  "Safety: Unsafe\\nCategories:", the category's name. A category's score is
  P(Unsafe) x P(its name | Unsafe).
- Granite Guardian and a caller's policy: "Yes" or "No" per risk / policy; the risk's
  score is P(Yes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdicts:
    """The ways each verdict can be written: {verdict: (text, ...)}, each text a way."""

    ways: Mapping[str, tuple[str, ...]]

    def texts(self) -> list[str]:
        return [text for texts in self.ways.values() for text in texts]


def verdict_probabilities(
    verdicts: Verdicts, text_probability: Mapping[str, float]
) -> tuple[dict[str, float], float]:
    """({verdict: probability, normalised among the verdicts}, label mass) from each
    way's whole-vocabulary probability (chain rule); an all-zero mass gives equal shares."""
    summed = {v: sum(text_probability[t] for t in texts) for v, texts in verdicts.ways.items()}
    mass = sum(summed.values())
    if mass <= 0.0:
        return {v: 1.0 / len(summed) for v in summed}, 0.0
    return {v: p / mass for v, p in summed.items()}, mass


def first_of(
    extensions: Mapping[str, Sequence[str]], probability: Mapping[str, float]
) -> dict[str, float]:
    """Each code's share of being written first, among the codes, from the probability of
    each code's tokens ({code: p}): a code whose tokens other codes extend
    (plan.code_extensions: "S1" before "S10" where digits are tokens) keeps only what
    they do not take (its p less theirs: the code written and not extended); normalised
    among the codes."""
    alone = {
        c: max(0.0, p - sum(probability[o] for o in extensions.get(c, ())))
        for c, p in probability.items()
    }
    total = sum(alone.values())
    if total <= 0.0:
        return {c: 1.0 / len(alone) for c in alone}
    return {c: p / total for c, p in alone.items()}


def category_scores(flagged: float, first: Mapping[str, float]) -> dict[str, float]:
    """A category's score: the flagging verdict's probability times its share among the
    categories the model would name (first_of)."""
    return {code: flagged * share for code, share in first.items()}


LLAMA_GUARD_VERDICTS = Verdicts({"safe": ("safe", "\n\nsafe"), "unsafe": ("unsafe", "\n\nunsafe")})
LLAMA_GUARD_AFTER_UNSAFE = "\n"  # "unsafe\nS1,S9": the codes' line
QWEN3GUARD_VERDICTS = Verdicts(
    {"Safe": (" Safe",), "Unsafe": (" Unsafe",), "Controversial": (" Controversial",)}
)
QWEN3GUARD_SAFETY = "Safety:"
QWEN3GUARD_CATEGORIES = "Safety: Unsafe\nCategories:"
YES_NO_VERDICTS = Verdicts({"Yes": ("Yes",), "No": ("No",)})  # after an assistant header
POLICY_VERDICTS = Verdicts({"Yes": (" Yes",), "No": (" No",)})  # after "Answer:"
