"""What each guard family classifies, and which of OpenAI's moderation keys each of its
categories answers (plain Python; the documented table of docs/moderation.md).

OpenAI's `/v1/moderations` reports 13 keys. An open guard has its own taxonomy (Llama
Guard 3's S1-S14, Qwen3Guard's nine categories, Granite Guardian's risks, or a caller's own
policies); a key is answered only by the guard categories that mean it, and a key no
category of the guard means is reported as such (null), never invented. Several guard
categories may answer one key (its score: the largest of theirs); one category may answer
several keys (Llama Guard's S1, violent crimes: violence and illicit/violent).

Sources: the model cards (Llama Guard 3's hazard taxonomy, MLCommons AILuminate v0.5;
Qwen3Guard's technical report; Granite Guardian 3.x's risk definitions), read as
/work/shared/notes/field-2026.md summarises them; the exact texts the prompts carry come
with each guard's chat template (models/guard_templates/).
"""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's moderation keys, in the order its API documents them (openai-python's
# types/moderation.py).
OPENAI_CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/instructions",
    "self-harm/intent",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)


@dataclass(frozen=True)
class GuardCategory:
    """One category of a guard's taxonomy: its code (what the model writes, or the
    risk's name its template takes), its name, and the OpenAI keys it answers."""

    code: str
    name: str
    openai: tuple[str, ...] = ()


@dataclass(frozen=True)
class Taxonomy:
    family: str
    categories: tuple[GuardCategory, ...]

    def codes(self) -> tuple[str, ...]:
        return tuple(c.code for c in self.categories)

    def category(self, code: str) -> GuardCategory:
        for c in self.categories:
            if c.code == code:
                return c
        raise KeyError(code)

    def unanswered(self) -> tuple[str, ...]:
        """The OpenAI keys no category of this guard means."""
        answered = {key for c in self.categories for key in c.openai}
        return tuple(key for key in OPENAI_CATEGORIES if key not in answered)


LLAMA_GUARD_3 = Taxonomy(
    "llama_guard_3",
    (
        GuardCategory("S1", "Violent Crimes", ("violence", "illicit/violent")),
        GuardCategory("S2", "Non-Violent Crimes", ("illicit",)),
        GuardCategory("S3", "Sex-Related Crimes", ("sexual",)),
        GuardCategory("S4", "Child Sexual Exploitation", ("sexual/minors",)),
        GuardCategory("S5", "Defamation"),
        GuardCategory("S6", "Specialized Advice"),
        GuardCategory("S7", "Privacy"),
        GuardCategory("S8", "Intellectual Property"),
        GuardCategory("S9", "Indiscriminate Weapons", ("illicit/violent",)),
        GuardCategory("S10", "Hate", ("hate",)),
        GuardCategory("S11", "Suicide & Self-Harm", ("self-harm",)),
        GuardCategory("S12", "Sexual Content", ("sexual",)),
        GuardCategory("S13", "Elections"),
        GuardCategory("S14", "Code Interpreter Abuse"),
    ),
)

QWEN3GUARD = Taxonomy(
    "qwen3guard",
    (
        GuardCategory("Violent", "Violent", ("violence",)),
        GuardCategory("Non-violent Illegal Acts", "Non-violent Illegal Acts", ("illicit",)),
        GuardCategory(
            "Sexual Content or Sexual Acts", "Sexual Content or Sexual Acts", ("sexual",)
        ),
        GuardCategory("PII", "Personally Identifiable Information"),
        GuardCategory("Suicide & Self-Harm", "Suicide & Self-Harm", ("self-harm",)),
        GuardCategory("Unethical Acts", "Unethical Acts"),
        GuardCategory("Politically Sensitive Topics", "Politically Sensitive Topics"),
        GuardCategory("Copyright Violation", "Copyright Violation"),
        GuardCategory("Jailbreak", "Jailbreak (prompts only)"),
    ),
)

GRANITE_GUARDIAN = Taxonomy(
    "granite_guardian",
    (
        GuardCategory("harm", "Harm (any of the risks below)"),
        GuardCategory("social_bias", "Social bias", ("hate",)),
        GuardCategory("jailbreak", "Jailbreaking"),
        GuardCategory("violence", "Violence", ("violence",)),
        GuardCategory("profanity", "Profanity", ("harassment",)),
        GuardCategory("sexual_content", "Sexual content", ("sexual",)),
        GuardCategory("unethical_behavior", "Unethical behavior"),
    ),
)

TAXONOMIES = {t.family: t for t in (LLAMA_GUARD_3, QWEN3GUARD, GRANITE_GUARDIAN)}


def openai_scores(
    taxonomy: Taxonomy | None, probabilities: dict[str, float]
) -> dict[str, float | None]:
    """OpenAI's 13 scores from a guard's category probabilities ({code: p}): each key the
    largest probability of the categories that answer it, None where none does (a caller's
    own policies answer no OpenAI key: all None)."""
    scores: dict[str, float | None] = {key: None for key in OPENAI_CATEGORIES}
    if taxonomy is None:
        return scores
    for code, p in probabilities.items():
        for key in taxonomy.category(code).openai:
            current = scores[key]
            scores[key] = p if current is None else max(current, p)
    return scores
