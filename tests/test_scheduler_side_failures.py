"""What a scheduler-side hook does with one request it cannot serve (issue 84): inside
SGLang's scheduler loop an exception stops the engine, so the request fails alone, or,
for a malformed value a client can send, runs as stock SGLang runs it. Plain decisions
and the prompt-logprob cache's failure path, with stand-ins for SGLang's request (the
setwise readout's failure inside a real engine: tests/test_prefill_kv_engine.py)."""

from __future__ import annotations

import logging
import math
from http import HTTPStatus
from types import SimpleNamespace

import pytest

from prefillonly_sgl.features.prefill_kv.messages import (
    REUSABLE_LEN_KEY,
    SHARED_LEN_KEY,
    grouping_len_in,
    reusable_len_in,
)
from prefillonly_sgl.features.prefill_kv.policy import anchors_in_extend, discarded_readout_rows


@pytest.mark.parametrize("value", ["x", [3], {"a": 1}, None, math.nan, math.inf])
def test_a_reusable_length_that_is_not_a_number_reads_as_none(value):
    assert reusable_len_in({REUSABLE_LEN_KEY: value}) is None
    assert grouping_len_in({SHARED_LEN_KEY: value}) is None
    # a malformed shared length: grouped by R, as a prompt without one
    assert grouping_len_in({SHARED_LEN_KEY: value, REUSABLE_LEN_KEY: 40}) == 40


def test_lengths_read_as_they_always_were():
    assert reusable_len_in({REUSABLE_LEN_KEY: 12}) == 12
    assert reusable_len_in({REUSABLE_LEN_KEY: "12"}) == 12
    assert reusable_len_in({REUSABLE_LEN_KEY: 12.0}) == 12
    assert grouping_len_in({SHARED_LEN_KEY: 8, REUSABLE_LEN_KEY: 40}) == 8
    assert reusable_len_in({"other": 1}) is None and reusable_len_in(None) is None


def test_anchors_become_rows_of_the_extend_or_the_violation_is_named():
    assert anchors_in_extend([62, 65], 60) == [2, 5]
    with pytest.raises(ValueError, match="anchor at 30 lies in the 60 tokens"):
        anchors_in_extend([30, 65], 60)


def test_a_failed_setwise_request_reads_one_row_per_anchor_where_sglang_counts_it():
    # extend of 6 rows after 60 cached tokens, SGLang's logprob rows from row 4
    rows = discarded_readout_rows([30, 61, 65], 60, first_logprob_row=4, extend_len=6)
    assert rows == [4, 4, 5]
    assert discarded_readout_rows([30], 60, first_logprob_row=0, extend_len=6) == [0]
    assert discarded_readout_rows([30], 60, first_logprob_row=9, extend_len=6) == [5]


class _Req(SimpleNamespace):
    def finished(self) -> bool:
        return self.finished_reason is not None


def _served_request(computed: int):
    """A finished echo request of a 6-token prompt served through the prompt-logprob
    table: 3 positions copied at its match, `computed` entries from its forward (5 - 2 = 3
    add up: a None and positions 3..5; anything else does not)."""
    from prefillonly_sgl.features.prompt_logprobs import scheduler_process as sp
    from prefillonly_sgl.features.prompt_logprobs.table import CachedRows

    logprob = SimpleNamespace(
        input_token_logprobs_val=None,
        input_token_logprobs_idx=None,
        input_top_logprobs_val=None,
        input_top_logprobs_idx=None,
    )
    req = _Req(
        rid="r1",
        logprob=logprob,
        origin_input_ids=[11, 12, 13, 14, 15, 16],
        logprob_start_len=3,
        finished_reason="length",
        to_finish=None,
    )
    setattr(req, sp._TOP_K_ATTR, 0)
    setattr(req, sp._ROWS_ATTR, CachedRows([-1.0, -2.0, -3.0], [], []))

    def original(self, i, req, *args, **kwargs):  # SGLang's: stores the computed entries
        req.logprob.input_token_logprobs_val = [None] + [-0.5] * (computed - 1)
        req.logprob.input_token_logprobs_idx = [14, 15, 16][:computed]

    return sp, req, original


def test_prompt_logprobs_that_do_not_add_up_fail_their_request_alone(caplog):
    sp, req, original = _served_request(computed=2)
    with caplog.at_level(logging.ERROR):
        sp._around_add_input_logprob_return_values(original, None, 0, req)
    assert req.finished_reason.status_code == HTTPStatus.INTERNAL_SERVER_ERROR
    assert "prompt logprobs of request r1" in req.finished_reason.message
    assert "2 computed positions after 3 cached ones" in req.finished_reason.message
    assert getattr(req, sp._ROWS_ATTR) is None
    assert "this request failed" in caplog.text


def test_prompt_logprobs_that_add_up_are_spliced():
    sp, req, original = _served_request(computed=3)
    sp._around_add_input_logprob_return_values(original, None, 0, req)
    assert req.finished_reason == "length" and req.logprob_start_len == 0
    assert req.logprob.input_token_logprobs_val == [None, -1.0, -2.0, -3.0, -0.5, -0.5]
