"""The plain decisions of single-token OpenAI requests (no server): which requests
qualify, the checks on their fields, their reusable prefix, named-id logprob rows and
the one-chunk stream."""

from __future__ import annotations

import json

import pytest

from prefillonly_sgl.features.prefill_kv.policy import runs_one_forward
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.scoring.reusable_prefix import (
    WHOLE_PROMPT,
    prefix_ids_in,
    with_prefix_ids,
    with_whole_prompt,
    without_prefix_ids,
)
from prefillonly_sgl.single_token.logprobs import text_offsets, top_rows
from prefillonly_sgl.single_token.prefix import completion_prefix, prefix_token_ids
from prefillonly_sgl.single_token.requests import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    check_single_token_body,
    is_loglikelihood,
    is_single_token,
)

VOCAB = 400


@pytest.mark.parametrize(
    ("path", "body", "single"),
    [
        (CHAT_PATH, {"max_tokens": 1}, True),
        (CHAT_PATH, {"max_completion_tokens": 1, "max_tokens": 5}, True),
        (CHAT_PATH, {"max_completion_tokens": 2, "max_tokens": 1}, False),
        (CHAT_PATH, {}, False),  # no limit: generation
        (CHAT_PATH, {"max_tokens": True}, False),  # a bool is not a count
        (COMPLETIONS_PATH, {"max_tokens": 1}, True),
        (COMPLETIONS_PATH, {}, False),  # OpenAI's default is 16
        (COMPLETIONS_PATH, {"max_tokens": 1, "echo": True}, False),  # prompt logprobs
        ("/generate", {"max_tokens": 1}, False),
    ],
)
def test_which_requests_are_single_token(path, body, single):
    assert is_single_token(path, body) is single


def test_runs_one_forward():
    assert runs_one_forward(0) and runs_one_forward(1)
    assert not runs_one_forward(2) and not runs_one_forward(None)


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        (CHAT_PATH, {"logprobs": True, "top_logprobs": 21}, "from 0 to 20"),
        (CHAT_PATH, {"top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        (CHAT_PATH, {"logprobs": "yes"}, "logprobs must be true or false"),
        (COMPLETIONS_PATH, {"logprobs": -1}, "logprobs must be an integer"),
        (CHAT_PATH, {"logit_bias": {"abc": 1}}, "logit_bias keys must be token ids"),
        (CHAT_PATH, {"logit_bias": {"400": 1}}, "from 0 to 399"),
        (CHAT_PATH, {"logit_bias": {"3": "high"}}, "logit_bias[3] must be a number"),
        (CHAT_PATH, {"logit_bias": [1]}, "logit_bias must be an object"),
        (CHAT_PATH, {"logprob_token_ids": [1]}, "needs logprobs: true"),
        (COMPLETIONS_PATH, {"logprob_token_ids": [1]}, "needs logprobs (an integer"),
        (CHAT_PATH, {"logprobs": True, "logprob_token_ids": []}, "non-empty list"),
        (CHAT_PATH, {"logprobs": True, "logprob_token_ids": [400]}, "from 0 to 399"),
        (CHAT_PATH, {"logprobs": True, "logprob_token_ids": list(range(300))}, "at most 256"),
        (CHAT_PATH, {"shared_prefix": "a"}, "shared_prefix is for /v1/completions"),
        (COMPLETIONS_PATH, {"prompt": "abc", "shared_prefix": "x"}, "prompt does not start"),
        (COMPLETIONS_PATH, {"prompt": ["ab", "xb"], "shared_prefix": "a"}, r"prompt[1] does"),
        (COMPLETIONS_PATH, {"prompt": [1, 2], "shared_prefix": "a"}, "give it as token ids"),
        (COMPLETIONS_PATH, {"prompt": "ab", "shared_prefix": [1]}, "give it as text"),
        (COMPLETIONS_PATH, {"prompt": [[1, 2]], "shared_prefix": [2]}, "does not start"),
        (COMPLETIONS_PATH, {"prompt": "ab", "shared_prefix": 3}, "string or a list of token"),
    ],
)
def test_bad_fields_are_named(path, body, message):
    with pytest.raises(InvalidRequestError) as e:
        check_single_token_body(path, {"max_tokens": 1, **body}, VOCAB)
    assert message in str(e.value)


def test_good_fields_pass():
    check_single_token_body(
        CHAT_PATH,
        {"logprobs": True, "top_logprobs": 20, "logit_bias": {"3": -100, "4": 100.0},
         "logprob_token_ids": [1, 2, 399]},
        VOCAB,
    )  # fmt: skip
    check_single_token_body(
        COMPLETIONS_PATH,
        {"prompt": [[5, 6, 7], [5, 6]], "shared_prefix": [5, 6], "logprobs": 0,
         "logprob_token_ids": [9]},
        VOCAB,
    )  # fmt: skip


def test_completion_prefix_rules():
    assert completion_prefix("abc", "ab") == "ab"  # marked
    assert completion_prefix(["user: a. q1", "user: a. q2"], None) == "user: a. q"
    assert completion_prefix([[1, 2, 3], [1, 2, 4], [1, 2]], None) == [1, 2]
    assert completion_prefix([[1, 2], [3]], None) is None  # nothing shared
    assert completion_prefix("abc", None) is None  # one unmarked prompt: cache only
    assert completion_prefix([1, 2, 3], None) is None  # one prompt of token ids
    assert prefix_token_ids(None, str.split) == []
    assert prefix_token_ids("a b", lambda text: [len(w) for w in text.split()]) == [1, 1]


def test_prefix_ids_travel_in_custom_params_and_leave():
    params = with_prefix_ids({"user": 1}, [4, 5])
    assert prefix_ids_in(params) == [4, 5] and prefix_ids_in({"user": 1}) is None
    assert prefix_ids_in(with_prefix_ids(None, [])) == []  # marked: nothing to keep
    assert without_prefix_ids(params) == {"user": 1}


def test_named_ids_rows_follow_the_request_order():
    rows = [[(-1.0, 7, "a"), (-2.0, 3, "b"), (-9.0, 5, "c")], None]
    assert top_rows(rows, [5, 7, 3]) == [[(-9.0, 5, "c"), (-1.0, 7, "a"), (-2.0, 3, "b")], None]
    # vLLM's semantics: the sampled token too, after the requested ones, once
    sampled = [(-0.5, 8, "d"), None]
    assert top_rows(rows[:1], [5, 7, 3], sampled) == [
        [(-9.0, 5, "c"), (-1.0, 7, "a"), (-2.0, 3, "b"), (-0.5, 8, "d")]
    ]
    assert top_rows(rows[:1], [5, 7], [(-1.0, 7, "a")]) == [[(-9.0, 5, "c"), (-1.0, 7, "a")]]


def test_choice_chunk_events():
    from prefillonly_sgl.sglang_runtime.single_token import choice_chunk_events

    answer = {
        "id": "x", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Yes"},
                     "logprobs": {"content": []}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }  # fmt: skip
    events = choice_chunk_events(CHAT_PATH, answer, include_usage=True)
    assert events[-1] == "data: [DONE]\n\n" and len(events) == 3
    chunk = json.loads(events[0][len("data: ") :])
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"][0]["delta"] == {"role": "assistant", "content": "Yes"}
    assert json.loads(events[1][len("data: ") :])["choices"] == []
    plain = choice_chunk_events(COMPLETIONS_PATH, {**answer, "choices": [{"text": "a"}]}, False)
    assert len(plain) == 2 and json.loads(plain[0][6:])["choices"][0]["text"] == "a"
    # several choices: one chunk each, in order (clients track choices by chunk)
    two = [{"index": 0, "text": "a"}, {"index": 1, "text": "b"}]
    events = choice_chunk_events(COMPLETIONS_PATH, {**answer, "choices": two}, True)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert [[c["index"] for c in chunk["choices"]] for chunk in chunks] == [[0], [1], []]


def test_chat_prefix_ids_render_the_history_once_or_nothing():
    from prefillonly_sgl.models.tiny import build_tokenizer
    from prefillonly_sgl.sglang_runtime.single_token import ChatRequest
    from prefillonly_sgl.single_token.prefix import chat_prefix_ids

    tok = build_tokenizer()
    messages = [{"role": "system", "content": "Label it."},
                {"role": "user", "content": "works"}, {"role": "assistant", "content": "Yes"},
                {"role": "user", "content": "awful"}]  # fmt: skip
    request = ChatRequest(messages=messages, max_tokens=1)
    ids = chat_prefix_ids(tok, request)
    history = tok.apply_chat_template(messages[:-1], tokenize=False)
    assert ids == tok.encode(history, add_special_tokens=False) and ids
    full = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                   return_dict=False)  # fmt: skip
    assert full[: len(ids)] == ids  # the history is a prefix of the prompt
    assert chat_prefix_ids(tok, request) is ids  # rendered once (cached)
    assert chat_prefix_ids(tok, ChatRequest(messages=messages[-1:], max_tokens=1)) == []
    tok.chat_template = "{{ raise_exception('needs the whole conversation') }}"
    other = ChatRequest(messages=[{"role": "system", "content": "x"}, *messages[1:]])
    assert chat_prefix_ids(tok, other) == []  # nothing marked: cache-only reuse


def test_loglikelihood_requests_are_echo_completions_of_zero_or_one_token():
    path = "/v1/completions"
    assert is_loglikelihood(path, {"echo": True, "max_tokens": 0, "logprobs": 1})
    assert is_loglikelihood(path, {"echo": True, "max_tokens": 1})
    assert not is_loglikelihood(path, {"echo": True})  # 16 tokens by default
    assert not is_loglikelihood(path, {"echo": False, "max_tokens": 1})
    assert not is_loglikelihood("/v1/chat/completions", {"echo": True, "max_tokens": 1})
    assert not is_loglikelihood(path, {"echo": True, "max_tokens": True})
    marked = with_whole_prompt({"user": 1})
    assert prefix_ids_in(marked) == WHOLE_PROMPT and without_prefix_ids(marked) == {"user": 1}


def test_text_offsets_are_each_tokens_first_character():
    assert text_offsets(["Question", ":", " what", "\n"]) == [0, 8, 9, 14]
    assert text_offsets([]) == []


# -- allowed_token_ids (single_token/allowed_tokens.py) -------------------------------------


def test_allowed_token_ids_are_checked_naming_the_field():
    from prefillonly_sgl.single_token.allowed_tokens import check_allowed_token_ids

    assert check_allowed_token_ids([5, 3, 5], 10) == [5, 3]
    for bad in ([], None, "5", [10], [-1], [True], [1.0]):
        with pytest.raises(InvalidRequestError, match="allowed_token_ids"):
            check_allowed_token_ids(bad, 10)


def test_the_restricted_choice_is_vllms_greedy_and_sampled_pick():
    from prefillonly_sgl.single_token.allowed_tokens import restricted_choice

    rows = [(-2.0, 7, "a"), (-0.5, 9, "b"), (-0.5, 4, "c"), (-9.0, 1, "d")]
    greedy = {"temperature": 0.0}
    assert restricted_choice(rows, greedy)[1] == 4  # the best; the lowest id on a tie
    assert restricted_choice(rows, {"temperature": 0.7, "top_k": 1})[1] == 4
    seeded = {"temperature": 1.0, "sampling_seed": 3}
    assert restricted_choice(rows, seeded, 0) == restricted_choice(rows, seeded, 0)
    drawn = {
        restricted_choice(rows, {"temperature": 1.0, "sampling_seed": s})[1] for s in range(200)
    }
    assert drawn <= {7, 9, 4, 1} and {9, 4} <= drawn
    # top-k 2 keeps the two most likely; top-p 0.5 the most likely alone (it has 0.44)
    top2 = {restricted_choice(rows, {"temperature": 1.0, "top_k": 2, "sampling_seed": s})[1]
            for s in range(100)}  # fmt: skip
    assert top2 == {9, 4}
    nucleus = {restricted_choice(rows, {"temperature": 1.0, "top_p": 0.3, "sampling_seed": s})[1]
               for s in range(100)}  # fmt: skip
    assert nucleus == {4}
    with pytest.raises(ValueError, match="no logprob"):
        restricted_choice([], greedy)


def test_a_generating_request_is_masked_and_its_own_bias_kept_on_the_allowed():
    from prefillonly_sgl.single_token.allowed_tokens import MASKED_OUT, finish_of, mask_bias

    bias = mask_bias([1, 3], 5, {"3": 2.5, "0": 9.0})
    assert bias == {"0": MASKED_OUT, "2": MASKED_OUT, "4": MASKED_OUT, "3": 2.5}
    assert finish_of(2, set(), False, {2}) == {"type": "stop", "matched": 2}
    assert finish_of(2, set(), True, {2}) == {"type": "length", "length": 1}
    assert finish_of(7, {7}, True, {2}) == {"type": "stop", "matched": 7}
