"""Which inputs and categories a moderation answer flags (plain Python): the booleans of
OpenAI's `flagged` and `categories`, decided from the probabilities read off the prefill.

- A guard that answers yes / no per risk or policy (Granite Guardian, the policy
  classifier): a risk is flagged when P(Yes) >= threshold; the input when any risk is.
- A guard that writes one verdict and then the categories it violates (Llama Guard 3,
  Qwen3Guard): the input is flagged when P(its unsafe verdict) >= threshold, and then its
  category is the one the model would write first (the largest category score: what
  greedy decoding writes), with every category whose own score reaches the threshold.
  Qwen3Guard's "Controversial" does not flag (its card's loose reading; the verdicts'
  probabilities go out with the answer for a strict one).
- An OpenAI key is flagged when a guard category that answers it is; a key no category
  of the guard answers is None (taxonomies.openai_scores: its score is None too).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillonly_sgl.moderation.plan import InputResult
from prefillonly_sgl.moderation.taxonomies import OPENAI_CATEGORIES, Taxonomy, openai_scores

DEFAULT_THRESHOLD = 0.5
YES_NO_GUARDS = ("granite_guardian", "policy")


@dataclass(frozen=True)
class Flags:
    """One input's answer in OpenAI's terms and the guard's own."""

    flagged: bool
    guard_flags: dict[str, bool]  # {guard category / policy: flagged}
    openai_flags: dict[str, bool | None]  # OpenAI's 13 keys (None: the guard has no answer)
    openai_scores: dict[str, float | None]


def flags_of(
    guard: str,
    taxonomy: Taxonomy | None,
    result: InputResult,
    threshold: float = DEFAULT_THRESHOLD,
) -> Flags:
    """The flags of one input's result (module docstring)."""
    scores = result.categories
    if guard in YES_NO_GUARDS:
        guard_flags = {code: p >= threshold for code, p in scores.items()}
        flagged = any(guard_flags.values())
    else:
        flagged = result.flagged_probability >= threshold
        first = max(scores, key=scores.__getitem__) if scores else None
        guard_flags = {
            code: flagged and (code == first or p >= threshold) for code, p in scores.items()
        }
    openai_flags: dict[str, bool | None] = {key: None for key in OPENAI_CATEGORIES}
    if taxonomy is not None:
        for code, on in guard_flags.items():
            for key in taxonomy.category(code).openai:
                openai_flags[key] = bool(openai_flags[key]) or on
    return Flags(flagged, guard_flags, openai_flags, openai_scores(taxonomy, scores))
