"""How a scoring function marks its prompt's reusable prefix, and chat-template rendering.

A decorated function returns either a plain string (the whole prompt is the item) or a
``Prompt(prefix=..., item=...)``; a likelihood ranker's also names the ``continuation``
whose log-probability after the prompt is the item's score (the query, in query
likelihood). The prefix is what many calls share (a user profile,
few-shot examples); it becomes the SGLang score request's ``query`` and the item text one
of its ``items``. SGLang scores ``query + item`` tokenized as one text, so the split never
changes a result, only how requests are grouped and what the prefix cache can reuse.

With ``chat=True`` the prompt (prefix + item) is the user turn of the model's chat
template, after an optional system turn, followed by the opening of the assistant turn.
The rendered text is split at the item: query = everything up to the item (template
header, system turn, prefix), item = the item text plus the template's closing of the
user turn and opening of the assistant turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError

_ITEM_MARK = "\ue000PREFILLONLY_ITEM\ue000"  # private-use characters: never in real text


@dataclass(frozen=True)
class Prompt:
    """A prompt split into the shared ``prefix`` and the per-call ``item``; ``continuation``:
    the text after it whose tokens a likelihood ranker scores (``@ranker(method=
    "likelihood")``), tokenized on its own after the prompt's tokens.

    On a vision-language model, ``images``: the prefix's images (shared by every item
    with this prefix: computed once, in the reusable prefix), ``item_images``: the item's
    own; each a path, URL, data URL, bytes or PIL image, placed at the text's image
    placeholders or first (docs/images.md; with chat=True write the placeholder in the
    prefix). They are loaded where the call runs (a server never reads its own files)."""

    prefix: str = ""
    item: str = ""
    continuation: str = ""
    images: tuple = ()
    item_images: tuple = ()

    def __post_init__(self) -> None:
        for name in ("images", "item_images"):
            value = getattr(self, name)
            if not isinstance(value, tuple):
                value = tuple(value) if isinstance(value, list) else (value,)
                object.__setattr__(self, name, value)

    @property
    def text(self) -> str:
        return self.prefix + self.item


@dataclass(frozen=True)
class ChatFormat:
    """Render prompts through a tokenizer's chat template (``system``: optional system turn)."""

    system: str | None = None

    def render(self, prompt: Prompt, tokenizer) -> Prompt:
        """The chat-formatted prompt, split so that ``prefix`` ends where the item starts."""
        if not getattr(tokenizer, "chat_template", None):
            raise InvalidRequestError(
                "chat=True but this tokenizer has no chat template; declare the function "
                "without chat=True or use an instruct model"
            )
        marked = self._apply(tokenizer, prompt.prefix + _ITEM_MARK)
        if marked.count(_ITEM_MARK) != 1:
            raise InvalidRequestError("the chat template does not keep the user message intact")
        head, tail = marked.split(_ITEM_MARK)
        whole = self._apply(tokenizer, prompt.prefix + prompt.item)
        if whole != head + prompt.item + tail:
            # e.g. a template that strips or escapes the message: the split would lie.
            raise InvalidRequestError(
                "the chat template changes the user message (it strips or rewrites it), so "
                "the prompt cannot be split into prefix and item; pass chat=False and "
                "format the prompt yourself"
            )
        return Prompt(
            prefix=_without_duplicate_bos(head, tokenizer),
            item=prompt.item + tail,
            continuation=prompt.continuation,  # the assistant's answer, after the template
            images=prompt.images,
            item_images=prompt.item_images,
        )

    def _apply(self, tokenizer, user: str) -> str:
        messages = [] if self.system is None else [{"role": "system", "content": self.system}]
        messages.append({"role": "user", "content": user})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _without_duplicate_bos(text: str, tokenizer) -> str:
    """Templates such as Llama 3's write the BOS token as text; SGLang's encode() adds it
    again when the tokenizer adds special tokens, so drop the written one then."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not text.startswith(bos) or tokenizer.bos_token_id is None:
        return text
    if tokenizer.encode("x")[:1] == [tokenizer.bos_token_id]:
        return text[len(bos) :]
    return text
