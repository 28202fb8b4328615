"""Token ids written after a text prompt, as text (plain Python).

A prompt with images reaches SGLang as text: its processor expands each image placeholder
to the image's tokens, and SGLang decodes token ids back to text before it does (so ids
gain nothing). Tokens that follow such a prompt (a choice answer written so far, a label's
first tokens behind which the next is read) therefore travel as their decoded text, which
is exact only when the whole text tokenizes back to the prompt's ids then those tokens;
where it does not, NotExactAsText says so (the caller takes another way: a choice request
SGLang's own path), never a near answer.

    tail = appended_text(prompt_text, prompt_ids, more, encode, decode)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prefillonly_sgl.scoring.errors import InvalidRequestError


class NotExactAsText(InvalidRequestError):
    """Tokens after a text prompt that their text would not tokenize back to."""


def appended_text(
    text: str,
    text_ids: Sequence[int],
    more: Sequence[int],
    encode: Callable[[str], list[int]],
    decode: Callable[[list[int]], str],
) -> str:
    """The text of ``more`` to append to ``text`` (whose tokens are ``text_ids``), checked
    to tokenize back to ``text_ids + more`` whole."""
    if not more:
        return ""
    tail = decode(list(more))
    if list(encode(text + tail)) != [*text_ids, *more]:
        raise NotExactAsText(
            f"the tokens {list(more)} after the prompt do not survive as text ({tail!r} "
            "tokenizes differently there)"
        )
    return tail
