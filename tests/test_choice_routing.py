"""Which way a constrained chat or completions request goes, and what its answer's
response and usage are made of (choices/routing.py, answering.query_len,
rendering.response_for and Tally): plain Python, no SGLang."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from prefillonly_sgl.choices.answering import Answer, FieldAnswer, query_len
from prefillonly_sgl.choices.constraints import FALL_THROUGH_FIELDS
from prefillonly_sgl.choices.rendering import Tally, response_for
from prefillonly_sgl.choices.routing import (
    REFUSED,
    SCORED,
    SGLANG_PATH,
    UNCONSTRAINED,
    VLLM_FIELDS,
    VLLMConstraints,
    answer_token_limit,
    falls_through_after_conversion,
    route,
    sglang_path_update,
)
from prefillonly_sgl.choices.selection import Step
from prefillonly_sgl.choices.shapes import ChoiceShape, Fixed, Slot

CHOICE = {"guided_choice": ["yes", "no"]}


def test_vllm_constraint_fields():
    assert VLLM_FIELDS == (
        "structured_outputs", "guided_choice", "guided_regex", "guided_json", "guided_grammar",
    )  # fmt: skip
    parsed = VLLMConstraints.model_validate({"guided_json": '{"type": "string"}'})
    assert parsed.guided_json == '{"type": "string"}' and parsed.guided_choice is None


def test_the_ways_a_request_goes():
    assert route({"messages": []}, chat=True, head=False).way == UNCONSTRAINED
    assert route({"response_format": {"type": "text"}}, chat=True, head=False).way == UNCONSTRAINED
    scored = route(CHOICE, chat=True, head=False)
    assert scored.way == SCORED and scored.constraint.shape.slots[0].texts == ("yes", "no")
    # a model with a classification head has no vocabulary to score choices over
    assert route(CHOICE, chat=True, head=True).way == SGLANG_PATH
    free = route({"guided_regex": "[a-z]+"}, chat=False, head=False)
    assert free.way == SGLANG_PATH and free.constraint.sglang_fields == {"regex": "[a-z]+"}
    two = route({**CHOICE, "regex": "a|b"}, chat=True, head=False)
    assert two.way == REFUSED and "give one structured-output constraint, got 2" in two.error
    bad = route({"structured_outputs": {"choice": ["a"], "nope": 1}}, chat=True, head=False)
    assert bad.way == REFUSED and "unknown fields ['nope']" in bad.error


# Each field scoring cannot honour, with a value that asks for it (and its "not asked").
ASKED = {
    "logit_bias": ({"5": 1.0}, {}), "stop": (["\n"], []), "stop_token_ids": ([2], None),
    "stop_regex": ("x+", None), "tools": ([{"type": "function"}], []), "echo": (True, False),
    "suffix": ("!", None), "allowed_token_ids": ([3, 4], None),
    "logprob_token_ids": ([3], None), "frequency_penalty": (0.5, 0.0),
    "presence_penalty": (-0.5, 0.0), "repetition_penalty": (1.1, 1.0), "min_tokens": (2, 0),
    "return_hidden_states": (True, False), "custom_logit_processor": ("p", None),
    "best_of": (2, 1), "ignore_eos": (True, False),
}  # fmt: skip


def test_every_fall_through_field_is_covered_here():
    assert set(ASKED) == set(FALL_THROUGH_FIELDS)


@pytest.mark.parametrize("name", sorted(ASKED))
def test_a_choice_asking_what_scoring_cannot_honour_keeps_sglang_path(name):
    asked, unasked = ASKED[name]
    for chat in (True, False):
        assert route({**CHOICE, name: asked}, chat, head=False).way == SGLANG_PATH
        assert route({**CHOICE, name: unasked}, chat, head=False).way == SCORED


def test_tools_the_model_may_not_call_do_not_count():
    body = {**CHOICE, "tools": [{"type": "function"}], "tool_choice": "none"}
    assert route(body, chat=True, head=False).way == SCORED


def test_sglang_path_fields():
    constraint = route(CHOICE, chat=True, head=False).constraint
    # vLLM's field cleared, the constraint in SGLang's
    assert sglang_path_update({**CHOICE, "guided_regex": None}, constraint) == {
        "guided_choice": None,
        "regex": "(yes|no)",
    }
    structured = {"structured_outputs": {"json": {"type": "string"}}}
    on_chat = sglang_path_update(structured, route(structured, True, False).constraint)
    assert on_chat["structured_outputs"] is None
    assert on_chat["response_format"]["json_schema"]["schema"] == {"type": "string"}
    # SGLang's own constraint: nothing to change
    regex = {"regex": "[0-9]+"}
    assert sglang_path_update(regex, route(regex, False, False).constraint) == {}


def test_the_answer_token_limit_the_client_gave():
    assert answer_token_limit({"max_tokens": 5}, chat=True, max_tokens_given=True) == 5
    both = {"max_tokens": 5, "max_completion_tokens": 3}
    assert answer_token_limit(both, chat=True, max_tokens_given=True) == 3
    assert answer_token_limit({}, chat=True, max_tokens_given=False) is None
    # completions' default of 16 is not a limit the client asked for
    assert answer_token_limit({"max_tokens": 16}, chat=False, max_tokens_given=False) is None
    assert answer_token_limit({"max_tokens": 2}, chat=False, max_tokens_given=True) == 2


def _encode(text: str) -> list[int]:
    return [ord(c) for c in text]  # a token per character


def test_falling_through_after_sglang_converted_the_request():
    shape = ChoiceShape((Fixed('{"a": "'), Slot("a", ("x", "yyy"), ("x", "yyy")), Fixed('"}')))
    longest = len('{"a": "') + 3 + 2

    def falls(media=(), scores_images=True, prompts=1, limit=None):
        return falls_through_after_conversion(media, scores_images, prompts, limit, shape, _encode)

    assert falls(["video"]) and falls(["audio"]) and falls(["image", "audio"])
    assert not falls(["image"])  # scored with the images (a vision-language model)
    assert falls(["image"], scores_images=False)  # refused off its backend: SGLang's path
    assert falls(["image"], prompts=2)  # a chat has one prompt
    assert falls(limit=longest - 1)  # truncated
    assert not falls(limit=longest)
    assert not falls() and not falls(prompts=3)


def test_tokens_after_a_text_prompt_travel_as_exact_text():
    from prefillonly_sgl.scoring.appended_tokens import NotExactAsText, appended_text

    def encode(text):  # "ab" is one token (9), any other character its own
        out, i = [], 0
        while i < len(text):
            out.append(9 if text.startswith("ab", i) else ord(text[i]))
            i += 2 if out[-1] == 9 else 1
        return out

    def decode(ids):
        return "".join("ab" if t == 9 else chr(t) for t in ids)

    assert appended_text("xy", encode("xy"), [], encode, decode) == ""
    assert appended_text("xy", encode("xy"), [ord("b"), 9], encode, decode) == "bab"
    with pytest.raises(NotExactAsText, match="tokenizes differently"):
        appended_text("xa", encode("xa"), [ord("b")], encode, decode)  # would merge: "ab"


def test_the_image_parts_of_a_chat_named_where_they_are():
    from prefillonly_sgl.wire.chat_images import ChatImage, chat_images

    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "data:x"}},
            {"type": "input_image", "image_url": "https://h/i.png"},
        ]},
    ]  # fmt: skip
    rendered, images = chat_images(messages)
    assert images == [ChatImage("messages[1].content[1]", "data:x"),
                      ChatImage("messages[1].content[2]", "https://h/i.png")]  # fmt: skip
    assert rendered[0] == messages[0]
    assert rendered[1]["content"] == [{"type": "text", "text": "a"}, {"type": "image"},
                                      {"type": "image"}]  # fmt: skip


def test_the_query_is_the_reusable_prefix_leaving_the_item_a_token():
    assert query_len([], [1, 2, 3]) == 0
    assert query_len([1, 2, 9], [1, 2, 3]) == 2
    assert query_len([1, 2, 3], [1, 2, 3]) == 2  # the item is never empty
    assert query_len([1, 2, 3, 4], [1, 2, 3]) == 2


@dataclass
class _Result:  # a ScoreResult's usage fields
    prompt_tokens: int
    cached_tokens: int
    prompt_cached_tokens: int


def test_tally_counts_the_prompts_own_hits_once_and_every_computed_token():
    tally = Tally()
    tally.add(_Result(prompt_tokens=12, cached_tokens=8, prompt_cached_tokens=8), first=True)
    tally.add(_Result(prompt_tokens=14, cached_tokens=12, prompt_cached_tokens=12), first=False)
    assert (tally.prompt_cached, tally.computed) == (8, 4 + 2)


def _answer(text: str, token: int) -> Answer:
    slot = Slot(None, ("yes", "no"), ("yes", "no"))
    step = Step(token, -0.25, ((token, -0.25), (token + 1, -1.5)))
    return Answer(text, [token], [step], [FieldAnswer(slot, 0, [0.75, 0.25])])


def test_response_for_chat_and_completions():
    answers = [_answer("yes", 7), _answer("no", 8)]
    tally = Tally()
    tally.add(_Result(prompt_tokens=10, cached_tokens=4, prompt_cached_tokens=40), first=True)

    def decode(token: int) -> str:
        return f"<{token}>"

    chat = response_for(True, {"model": "m", "logprobs": True, "top_logprobs": 1}, answers,
                        decode, prompt_tokens=10, tally=tally)  # fmt: skip
    assert chat["object"] == "chat.completion" and chat["model"] == "m"
    assert [c["message"]["content"] for c in chat["choices"]] == ["yes", "no"]
    assert [c["index"] for c in chat["choices"]] == [0, 1]
    content = chat["choices"][0]["logprobs"]["content"]
    assert content[0]["token"] == "<7>" and len(content[0]["top_logprobs"]) == 1
    assert chat["choices"][0]["choice_probabilities"] == {"yes": 0.75, "no": 0.25}
    usage = chat["usage"]
    assert usage["prompt_tokens_details"] == {"cached_tokens": 10}  # never above the prompt
    assert (usage["completion_tokens"], usage["computed_tokens"]) == (2, 6)
    plain = response_for(True, {"model": "m", "logprobs": False}, answers, decode, 10, tally)
    assert plain["choices"][0]["logprobs"] is None
    completion = response_for(False, {"model": "m", "logprobs": 0}, answers, decode, 10, tally)
    assert completion["object"] == "text_completion"
    assert completion["choices"][1]["text"] == "no"
    assert completion["choices"][1]["logprobs"]["tokens"] == ["<8>"]
    unasked = response_for(False, {"model": "m", "logprobs": None}, answers, decode, 10, tally)
    assert unasked["choices"][0]["logprobs"] is None
