"""Which guard a checkpoint is, and how its prompts are written (plain Python).

A guard is recognised by its chat template (the text every checkpoint of the family
carries; models/guard_templates/ holds the published ones), or named by the caller
(`guard=`, `serve --guard`): a checkpoint saved without its family's template (a
fine-tune, a conversion) is then prompted with the published one (template_for). A model
whose template is none of them is not a guard: it moderates as a policy classifier, which
needs the caller's policies (a clear error without them).

| family            | recognised by (in the chat template)  | prompts per input              |
|-------------------|---------------------------------------|--------------------------------|
| qwen3guard        | "Controversial" and "Safety:"         | one                            |
| llama_guard_3     | "<BEGIN UNSAFE CONTENT CATEGORIES>"   | one, its categories in it      |
| granite_guardian  | "guardian_config"                     | one per risk (default: harm)   |
| policy            | anything else                         | one per policy                 |

Message formats the templates read: Llama Guard 3 1B reads only {"type": "text"} parts of
a message's content (a plain string renders an empty conversation), its 8B template reads
strings; both are given what they read (message_content). Llama Guard 3 1B takes the
categories as template arguments (`categories`, `excluded_category_keys`); the 8B has
S1-S14 written in. Which categories a rendered prompt lists is read off the prompt itself
(listed_codes), so the verdict's codes are the ones the model was shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefillonly_sgl.models import guard_templates
from prefillonly_sgl.moderation.taxonomies import (
    GRANITE_GUARDIAN,
    LLAMA_GUARD_3,
    QWEN3GUARD,
    Taxonomy,
)

GUARDS = ("llama_guard_3", "qwen3guard", "granite_guardian", "policy")
DEFAULT_GRANITE_RISK = "harm"
# the published template a named guard is prompted with when its checkpoint has none of
# its family's (models/guard_templates/README.md: where each comes from)
PUBLISHED_TEMPLATES = {
    "llama_guard_3": "llama_guard_3_1b.jinja",  # takes the categories as arguments
    "qwen3guard": "qwen3guard_gen.jinja",
    "granite_guardian": "granite_guardian_3_1.jinja",  # 3.1 and 3.2's prompt
}


def recognise(chat_template: str | None) -> str:
    """The guard family of a chat template ("policy": not a guard)."""
    text = chat_template or ""
    # Qwen3Guard's template borrows Llama Guard's category block: it is told first
    if "Controversial" in text and "Safety:" in text:
        return "qwen3guard"
    if "<BEGIN UNSAFE CONTENT CATEGORIES>" in text:
        return "llama_guard_3"
    if "guardian_config" in text:
        return "granite_guardian"
    return "policy"


def template_for(guard: str, chat_template: str | None) -> str | None:
    """The chat template a guard's prompts are rendered with: the checkpoint's own where
    it is the guard's family's, else the family's published one (None: the policy
    classifier, which uses none)."""
    if guard not in PUBLISHED_TEMPLATES or recognise(chat_template) == guard:
        return chat_template
    return guard_templates.template_text(PUBLISHED_TEMPLATES[guard])


def taxonomy_of(guard: str) -> Taxonomy | None:
    return {
        "llama_guard_3": LLAMA_GUARD_3,
        "qwen3guard": QWEN3GUARD,
        "granite_guardian": GRANITE_GUARDIAN,
    }.get(guard)


def reads_text_parts(chat_template: str | None) -> bool:
    """Whether the template reads a message's content as a list of typed parts (Llama
    Guard 3 1B's: "selectattr('type', ...)" over message['content'])."""
    text = chat_template or ""
    return "selectattr('type'" in text or 'selectattr("type"' in text


def message_content(text: str, parts: bool):
    return [{"type": "text", "text": text}] if parts else text


def takes_categories(chat_template: str | None) -> bool:
    """Llama Guard 3 1B's template takes its categories as arguments; the 8B's has them
    written in."""
    text = chat_template or ""
    return "categories is not defined" in text or "excluded_category_keys" in text


def listed_codes(taxonomy: Taxonomy, rendered: str) -> tuple[str, ...]:
    """The taxonomy's codes a rendered prompt lists ("S1: ..." lines), in the taxonomy's
    order."""
    return tuple(c for c in taxonomy.codes() if f"\n{c}: " in rendered)


def qwen3guard_codes(messages: Sequence[dict]) -> tuple[str, ...]:
    """Qwen3Guard's categories for a conversation: prompt moderation (the last message is
    the user's) asks nine; response moderation (the assistant's) eight, no Jailbreak."""
    codes = QWEN3GUARD.codes()
    if messages and messages[-1].get("role") == "assistant":
        return tuple(c for c in codes if c != "Jailbreak")
    return codes
