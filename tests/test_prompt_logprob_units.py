"""The prompt-logprob side table and its plan (plain torch / Python, no SGLang)."""

from __future__ import annotations

import pytest
import torch

from prefillonly_sgl.features.prompt_logprobs.plan import (
    caches_prompt_logprobs,
    splice,
    table_positions,
)
from prefillonly_sgl.features.prompt_logprobs.settings import PromptLogprobSettings
from prefillonly_sgl.features.prompt_logprobs.table import MAX_TOP_K, CachedRows, PositionTable

ECHO = dict(
    return_logprob=True, logprob_start_len=0, top_logprobs_num=1, named_token_ids=None,
    max_new_tokens=1, flat_top_logprobs=False, prompt_len=10,
)  # fmt: skip


def test_a_slot_serves_entries_until_it_is_handed_out_again():
    table = PositionTable(16)
    slots = torch.tensor([5, 9, 3])
    assert table.write(slots, [-0.5, -1.25, -2.0], [[-0.1], [-0.2], [-0.3]], [[7], [8], [9]]) == 3
    assert table.usable_run(slots, 1) == 3
    rows = table.read(slots, 1)
    assert rows.logprobs == [-0.5, -1.25, -2.0]
    assert rows.top_values == [[pytest.approx(-0.1)], [pytest.approx(-0.2)], [pytest.approx(-0.3)]]
    assert rows.top_ids == [[7], [8], [9]]
    table.invalidate(torch.tensor([9]))  # the allocator handed slot 9 to another token
    assert table.usable_run(slots, 1) == 1  # a run stops at the first unusable row
    assert table.usable_run(torch.tensor([], dtype=torch.int64), 1) == 0


def test_rows_widen_to_the_largest_top_k_and_a_narrower_write_keeps_them():
    table = PositionTable(8)
    table.write(torch.tensor([1]), [-1.0], [[-0.5]], [[4]])
    assert table.width == 1 and table.usable_run(torch.tensor([1]), 3) == 0  # k=3 needs more
    table.write(torch.tensor([1, 2]), [-1.0, -2.0], [[-0.5, -0.7, -0.9]] * 2, [[4, 5, 6]] * 2)
    assert table.width == 3 and table.usable_run(torch.tensor([1, 2]), 3) == 2
    assert table.read(torch.tensor([2]), 2).top_ids == [[4, 5]]  # the first k of a row
    assert table.write(torch.tensor([1]), [-9.0], [[-9.0]], [[1]]) == 0  # k=1 < kept 3
    assert table.read(torch.tensor([1]), 1).logprobs == [-1.0]


def test_dropped_tokens_slot_and_k_zero_and_limits():
    table = PositionTable(8)
    assert table.write(torch.tensor([0, 3]), [-1.0, -2.0], None, None, skip_slot=0) == 1
    assert table.usable_run(torch.tensor([3]), 0) == 1
    assert table.usable_run(torch.tensor([0]), 0) == 0
    with pytest.raises(ValueError, match="2 slots for 1 prompt positions"):
        table.write(torch.tensor([1, 2]), [-1.0], None, None)
    with pytest.raises(ValueError, match="over the table's limit"):
        k = MAX_TOP_K + 1
        table.write(torch.tensor([1]), [-1.0], [[-1.0] * k], [[1] * k])
    assert PositionTable(1000).nbytes() == 1000 * (1 + 1 + 4)  # width 0 until asked


def test_which_requests_the_table_serves():
    assert caches_prompt_logprobs(**ECHO)
    assert caches_prompt_logprobs(**{**ECHO, "max_new_tokens": 0, "top_logprobs_num": 20})
    for change in (
        {"return_logprob": False},
        {"logprob_start_len": -1},  # no prompt logprobs asked for
        {"logprob_start_len": 3},
        {"top_logprobs_num": 21},
        {"named_token_ids": [5]},
        {"max_new_tokens": 2},  # a generation: stock
        {"flat_top_logprobs": True},
        {"prompt_len": 1},
    ):
        assert not caches_prompt_logprobs(**{**ECHO, **change}), change


def test_the_last_cached_position_is_computed_again():
    assert table_positions(0, 0) == 0 and table_positions(1, 5) == 0
    assert table_positions(10, 9) == 9  # M - 1: token M's entry needs position M-1
    assert table_positions(10, 20) == 9
    assert table_positions(10, 4) == 4  # rows 1..4 usable: extend from 4


def test_splice_puts_the_table_entries_between_token_0_and_the_computed_ones():
    prompt = [11, 12, 13, 14, 15]
    cached = CachedRows([-1.0, -2.0], [[-0.5], [-0.6]], [[21], [22]])
    # SGLang computed positions 2..4 (logprob_start_len 2): None first, as it has no entry
    computed = ([None, -3.0, -4.0], [13, 14, 15], ([None, [-0.7], [-0.8]], [None, [23], [24]]))
    values, ids, (top_v, top_i) = splice(*computed, cached, prompt)
    assert values == [None, -1.0, -2.0, -3.0, -4.0] and ids == prompt
    assert top_v == [None, [-0.5], [-0.6], [-0.7], [-0.8]]
    assert top_i == [None, [21], [22], [23], [24]]
    assert splice(*computed, None, prompt) == computed  # nothing cached: SGLang's own
    with pytest.raises(ValueError, match="3 computed positions after 1 cached"):
        splice(*computed, CachedRows([-1.0], [[-0.5]], [[21]]), prompt)


def test_settings():
    assert PromptLogprobSettings().chunk_size == 512
    assert PromptLogprobSettings(256).peak_bytes(1000) == 3 * 256 * 1000 * 4
    assert PromptLogprobSettings.from_dict(PromptLogprobSettings(64).to_dict()).chunk_size == 64
    with pytest.raises(ValueError, match="positive integer"):
        PromptLogprobSettings(0)
