"""Which tokens of a scoring request keep pool KV (features/prefill_kv/policy.py), and
which a follower reads from its leader in the same forward (packing.py)."""

from __future__ import annotations

from array import array

from prefillonly_sgl.features.prefill_kv.packing import kept_end, packed_len
from prefillonly_sgl.features.prefill_kv.policy import (
    common_prefix_len,
    dropped_new_tokens,
    kept_new_tokens,
    kept_rows,
    reusable_prefix_len,
)


def test_common_prefix_len():
    assert common_prefix_len([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix_len([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5], [6]) == 0


def test_reusable_prefix_is_what_the_prompt_shares_with_the_query():
    assert reusable_prefix_len([1, 2, 3], [1, 2, 3, 7, 8]) == 3  # token ids: len(query)
    # BPE merged the query's last token with the item: that token is not reusable
    assert reusable_prefix_len([1, 2, 3], [1, 2, 9, 8]) == 2
    assert reusable_prefix_len(None, [1, 2]) == 0
    assert reusable_prefix_len([], [1, 2]) == 0


def test_cold_request_keeps_the_reusable_prefix_only():
    # 100-token prompt, query of 30 tokens, nothing cached
    assert kept_new_tokens(prefix_len=0, extend_len=100, total_len=100, reusable_len=30) == 30
    assert dropped_new_tokens(0, 100, 100, 30) == 70


def test_cache_hit_keeps_nothing_new():
    assert kept_new_tokens(prefix_len=30, extend_len=70, total_len=100, reusable_len=30) == 0
    # the cache holds less than the reusable prefix: the rest of it is kept
    assert kept_new_tokens(prefix_len=10, extend_len=90, total_len=100, reusable_len=30) == 20
    # the cache holds more (e.g. a generate request cached the whole prompt): nothing kept
    assert kept_new_tokens(prefix_len=99, extend_len=1, total_len=100, reusable_len=30) == 0


def test_no_reusable_prefix_keeps_only_the_first_token():
    # SGLang reads a request row without KV as already released
    assert kept_new_tokens(prefix_len=0, extend_len=100, total_len=100, reusable_len=0) == 1
    assert kept_new_tokens(prefix_len=1, extend_len=99, total_len=100, reusable_len=0) == 0


def test_query_is_the_whole_prompt_keeps_everything():
    assert kept_new_tokens(prefix_len=0, extend_len=100, total_len=100, reusable_len=100) == 100


def test_chunk_that_is_not_the_last_keeps_everything():
    # later chunks read earlier chunks' KV from the pool
    assert kept_new_tokens(prefix_len=0, extend_len=64, total_len=100, reusable_len=10) == 64
    # the last chunk drops its tail beyond max(R, prefix)
    assert kept_new_tokens(prefix_len=64, extend_len=36, total_len=100, reusable_len=10) == 0
    assert kept_new_tokens(prefix_len=64, extend_len=36, total_len=100, reusable_len=80) == 16


def test_kept_rows_are_each_requests_kept_tokens():
    assert kept_rows([2, 0, 1], [3, 2, 1]) == [0, 1, 5]
    assert kept_rows([0, 0], [4, 1]) == []


def test_recurrent_state_plan_drops_suffix_kv_only_where_a_state_is_cached():
    from prefillonly_sgl.features.prefill_kv.policy import (
        AS_IS,
        KEEP_ALL,
        SPLIT,
        recurrent_state_plan,
    )

    # cold, R inside the prompt: the first extend ends at R
    assert recurrent_state_plan(0, 100, 40, None) == SPLIT
    assert recurrent_state_plan(10, 100, 40, 64) == SPLIT  # a shorter cached prefix
    # a hit at R (or beyond: a whole prompt cached earlier) ends at a stored state
    assert recurrent_state_plan(40, 100, 40, None) == AS_IS
    assert recurrent_state_plan(60, 100, 40, None) == AS_IS
    assert recurrent_state_plan(7, 100, 0, None) == AS_IS
    # R covers the prompt: its final state is the one to keep
    assert recurrent_state_plan(0, 100, 100, None) == AS_IS
    # nothing reusable, nothing matched: the boundary would be the first token, whose
    # state no extend leaves -> keep every token (and the final state), as stock SGLang
    assert recurrent_state_plan(0, 100, 0, None) == KEEP_ALL
    # SGLang's chunk budget would cut the prompt before R: no state at R either
    assert recurrent_state_plan(0, 100, 40, 16) == KEEP_ALL


def test_a_leader_keeps_what_prefill_only_kv_keeps():
    """Where a leader's real slots end once its extend is allocated (packing.kept_end)."""
    assert kept_end(0, 100, 100, 30) == 30  # cold, R = 30: the prefix only
    assert kept_end(40, 100, 100, 30) == 40  # a hit beyond R keeps nothing new
    assert kept_end(0, 60, 100, 30) == 60  # not its last chunk: every token
    assert kept_end(0, 100, 100, None) == 100  # no R (generate): every token
    assert kept_end(0, 100, 100, 0) == 1  # nothing reusable: the first token


def test_a_follower_reads_the_common_prefix_within_what_the_leader_keeps():
    leader = list(range(100, 200))  # 100 tokens, keeps the first 60
    follower = list(range(100, 160)) + [7, 8, 9]
    assert packed_len(follower, 0, 62, leader, 60) == 60
    assert packed_len(follower, 10, 62, leader, 60) == 60  # from its own match on
    assert packed_len(follower, 0, 62, leader, 40) == 40  # the leader keeps less
    assert packed_len(follower, 0, 25, leader, 60) == 25  # its own cap (last token, logprobs)
    assert packed_len(follower, 60, 62, leader, 60) == 0  # nothing beyond its match
    other = list(range(100, 130)) + [1] * 33
    assert packed_len(other, 0, 62, leader, 60) == 30  # where the prompts part
    assert packed_len([5, 6], 0, 1, leader, 60) == 0  # nothing in common
    assert packed_len(leader[:15] + [0] * 20, 0, 30, leader, 60) == 0  # too few to matter
    assert packed_len(follower, 45, 62, leader, 60) == 0  # 15 more than its match: too few
    assert packed_len(array("q", follower), 0, 62, array("q", leader), 60) == 60  # SGLang's


def test_an_image_in_the_query_is_reusable_in_its_expanded_positions():
    from prefillonly_sgl.features.prefill_kv.policy import image_expanded_prefix_len

    pad = 9
    query = [1, 2, 7, pad, 8, 3]  # "<start><image><end>" once in the query's own tokens
    prompt = [1, 2, 7, pad, pad, pad, pad, 8, 3, 4, 5]  # the image is 4 tokens; item 4, 5
    assert reusable_prefix_len(query, prompt, image_pad=pad) == 9
    assert reusable_prefix_len(query, prompt) == 4  # not told: stops inside the image
    assert image_expanded_prefix_len(prompt[:9], prompt, pad) == 9  # given expanded
    # the item's own image (after the query) is not reusable; a text prompt is unchanged
    assert reusable_prefix_len([1, 2], [1, 2, 7, pad, pad, 8], image_pad=pad) == 2
    assert reusable_prefix_len([1, 2, 3], [1, 2, 4], image_pad=pad) == 2
    # an image that differs cannot be told by its placeholders: SGLang's cache key is the
    # image's hash (written over them in the scheduler), so R only marks what to keep
    assert image_expanded_prefix_len([7, pad, 8], [7, pad, pad, 6], pad) == 3
