"""The prompts a moderation call scores (plain Python over a Hugging Face tokenizer).

A guard's prompt is its checkpoint's own chat template, rendered with the template's
keyword arguments (Llama Guard 3: the categories and the excluded ones; Granite Guardian:
guardian_config with the risk), ending where the model writes its verdict
(add_generation_prompt). A model that is not a guard is a policy classifier: the
conversation, then each of the caller's policies, then a yes / no question, so the
conversation is the prompts' common prefix and every policy an item behind it.

Inputs are conversations: a text is one user message; OpenAI's text parts of one input
are joined as one message (OpenAI's moderation reads them together).
"""

from __future__ import annotations

from collections.abc import Sequence

Message = dict  # {"role": "user" | "assistant" | "system", "content": str}

POLICY_TEMPLATE = (
    "Conversation:\n{conversation}\n\nPolicy: {policy}\n"
    "Does the conversation violate the policy? Answer Yes or No.\nAnswer:"
)
ROLE_NAMES = {"user": "User", "assistant": "Assistant", "system": "System"}


def conversation_text(messages: Sequence[Message]) -> str:
    """A conversation as the policy classifier's prompt shows it: one line per turn."""
    return "\n".join(f"{ROLE_NAMES[m['role']]}: {m['content']}" for m in messages)


def policy_prompt(messages: Sequence[Message], policy: str) -> str:
    """The policy classifier's prompt for one conversation and one policy."""
    return POLICY_TEMPLATE.format(conversation=conversation_text(messages), policy=policy)


def render_guard(tokenizer, template: str, messages: Sequence[Message], **template_kwargs) -> str:
    """A guard's prompt: its chat template (guards.template_for) over the conversation,
    with its keyword arguments, up to where the assistant (the guard) writes its verdict."""
    return tokenizer.apply_chat_template(
        list(messages),
        chat_template=template,
        tokenize=False,
        add_generation_prompt=True,
        **template_kwargs,
    )


def prompt_ids(tokenizer, text: str, rendered_by_template: bool) -> tuple[int, ...]:
    """A prompt's token ids: a chat template writes its own special tokens (BOS
    included); a plain prompt gets the tokenizer's, as SGLang adds them to text."""
    return tuple(tokenizer.encode(text, add_special_tokens=not rendered_by_template))
