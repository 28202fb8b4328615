"""A text score call's prompts as token ids (scoring/text_prompts.py) and the shared
length prefill-only KV sends beside R (features/prefill_kv/messages.py): plain Python."""

from __future__ import annotations

from prefillonly_sgl.features.prefill_kv.messages import (
    grouping_len_in,
    with_reusable_len,
    with_shared_len,
)
from prefillonly_sgl.scoring.text_prompts import joined_token_ids


def _encode(text: str) -> list[int]:
    """A toy BPE: "ab" is one token, everything else a character."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("ab", i):
            out.append(1000)
            i += 2
        else:
            out.append(ord(text[i]))
            i += 1
    return out


def test_each_prompt_is_its_text_tokenized_whole():
    query, items = "profile: xy", [" item 1", "b merges", ""]
    ids, rest = joined_token_ids(_encode, query, items)
    for item, tail in zip(items, rest):
        assert ids + tail == _encode(query + item)  # SGLang's tokens, exactly
        assert tail  # no item is left empty
    assert ids == _encode(query)[:-1]  # the empty item keeps the query's last token


def test_a_merge_across_the_join_shortens_the_shared_part():
    ids, rest = joined_token_ids(_encode, "xa", ["b1", "c2"])  # "a"+"b" merge in one prompt
    assert ids == [ord("x")]
    assert [ids + r for r in rest] == [_encode("xab1"), _encode("xac2")]


def test_the_jct_scheduler_groups_by_the_shared_length_where_one_is_sent():
    assert grouping_len_in(with_reusable_len(None, 80)) == 80
    assert grouping_len_in(with_shared_len(with_reusable_len(None, 120), 80)) == 80
    assert grouping_len_in({"other": 1}) is None
