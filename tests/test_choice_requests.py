"""Choice requests answered by scoring, against a real `prefillonly serve` (tiny Llama,
float32) through the official `openai` client.

Each form (vLLM's `structured_outputs.choice`, the legacy `guided_choice`, a
`response_format` json_schema from a pydantic model, SGLang's `regex` alternation)
answers with valid content, and its answer and `choice_probabilities` equal an
independent reference within 1e-4: greedy decoding under the constraint done token by
token with a plain transformers forward at every step (the choices still possible
restricting each step), and each choice's probability by the chain rule. What is outside
the shape (a free string, a choice with logit_bias) keeps SGLang's grammar path."""

from __future__ import annotations

import json
import math
from enum import Enum

import pytest
import requests
from conftest import tiny_server
from openai import BadRequestError
from pydantic import BaseModel

pytestmark = pytest.mark.slow  # its own server and the openai client

TOL = 1e-4
SYSTEM = "You label drug reviews. Answer with one of the labels given. " * 8
FEW_SHOT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Review: works great"},
    {"role": "assistant", "content": "positive"},
]
SENTIMENTS = ["positive", "negative", "mixed feelings"]

server = tiny_server()


def chat(review: str) -> list[dict]:
    return [*FEW_SHOT, {"role": "user", "content": f"Review: {review}"}]


def chat_ids(reference, messages) -> list[int]:
    return list(
        reference.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    weights = [math.exp(x - top) for x in xs]
    return [w / sum(weights) for w in weights]


def constrained_greedy(reference, prompt_ids, parts) -> tuple[str, list[dict]]:
    """The reference: ``parts`` (fixed text, or a list of choices) written left to right
    after the prompt by a transformers forward per step; at each step of a slot the most
    probable next token among the choices still possible. A slot whose choices are not
    prefix-free is scored with what follows it (the next fixed text's first token, or
    EOS). Returns the text and each slot's {choice: probability}."""
    tok = reference.tokenizer

    def encode(text):
        return tok.encode(text, add_special_tokens=False)

    ids, text, probabilities = list(prompt_ids), "", []
    for k, part in enumerate(parts):
        if isinstance(part, str):
            ids += encode(part)
            text += part
            continue
        choices = [tuple(encode(c)) for c in part]
        following = parts[k + 1] if k + 1 < len(parts) else None
        end = encode(following)[0] if following else tok.eos_token_id
        if any(a != b and b[: len(a)] == a for a in choices for b in choices):
            choices = [c + (end,) for c in choices]
        sequences = [
            sum(
                float(reference.next_token_logprobs(ids + list(c[:j]))[c[j]]) for j in range(len(c))
            )
            for c in choices
        ]
        probabilities.append(dict(zip(part, softmax(sequences))))
        path, alive = (), list(range(len(choices)))
        while len(alive) > 1:
            logprobs = reference.next_token_logprobs(ids + list(path))
            allowed = {choices[i][len(path)] for i in alive}
            path += (max(allowed, key=lambda t: float(logprobs[t])),)
            alive = [i for i in alive if choices[i][: len(path)] == path]
        ids += encode(part[alive[0]])
        text += part[alive[0]]
    return text, probabilities


def assert_close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    assert max(abs(got[k] - want[k]) for k in want) < TOL, (got, want)


def test_structured_outputs_choice_is_the_constrained_greedy_answer(client, reference):
    messages = chat("it cured my headache but made me dizzy")
    answer = client.chat.completions.create(
        model="m", messages=messages, temperature=0, logprobs=True, top_logprobs=3,
        extra_body={"structured_outputs": {"choice": SENTIMENTS}},
    )  # fmt: skip
    prompt = chat_ids(reference, messages)
    text, (probabilities,) = constrained_greedy(reference, prompt, [SENTIMENTS])
    choice = answer.choices[0]
    assert choice.message.content == text and choice.finish_reason == "stop"
    assert_close(choice.model_extra["choice_probabilities"], probabilities)
    # logprobs: the answer's tokens, each with its log-prob over the vocabulary
    tokens = reference.tokenizer.encode(text, add_special_tokens=False)
    content = choice.logprobs.content
    assert [c.token for c in content] == [reference.tokenizer.decode([t]) for t in tokens]
    for j, (entry, token) in enumerate(zip(content, tokens)):
        want = float(reference.next_token_logprobs(prompt + tokens[:j])[token])
        assert abs(entry.logprob - want) < TOL
        assert entry.top_logprobs and entry.top_logprobs[0].logprob >= entry.logprob - TOL
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == len(tokens)


def test_guided_choice_on_completions_prefix_choices_and_several_prompts(client, reference):
    """The legacy field, honoured; "Yes" is a prefix of "Yes sir": both scored with EOS."""
    labels = ["Yes", "Yes sir", "No"]
    prefix = "Question: is this review positive?\n"
    prompts = [prefix + "Review: great pills\nAnswer:", prefix + "Review: awful\nAnswer:"]
    answer = client.completions.create(
        model="m", prompt=prompts, temperature=0, logprobs=2,
        extra_body={"guided_choice": [" " + label for label in labels], "shared_prefix": prefix},
    )  # fmt: skip
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, prompt in zip(answer.choices, prompts):
        ids = reference.tokenizer.encode(prompt)
        text, (probabilities,) = constrained_greedy(reference, ids, [[" " + x for x in labels]])
        assert choice.text == text
        assert_close(choice.model_extra["choice_probabilities"], probabilities)
        assert choice.logprobs.text_offset[0] == 0
    assert answer.usage.prompt_tokens == sum(len(reference.tokenizer.encode(p)) for p in prompts)


class Sentiment(str, Enum):
    positive = "positive"
    negative = "negative"
    mixed = "mixed feelings"


class Review(BaseModel):
    sentiment: Sentiment
    side_effects: bool


def test_response_format_schema_fields_in_order(client, reference):
    messages = chat("no effect at all, and a rash")
    answer = client.chat.completions.parse(
        model="m", messages=messages, temperature=0, response_format=Review
    )
    choice = answer.choices[0]
    parsed = choice.message.parsed
    assert isinstance(parsed, Review)  # valid JSON of the schema
    prompt = chat_ids(reference, messages)
    parts = ['{"sentiment":"', SENTIMENTS, '","side_effects":', ["true", "false"], "}"]
    text, (sentiment, effects) = constrained_greedy(reference, prompt, parts)
    assert choice.message.content == text  # compact, in the schema's property order
    got = choice.model_extra["choice_probabilities"]
    assert_close(got["sentiment"], sentiment)
    assert_close(got["side_effects"], effects)
    again = client.chat.completions.parse(
        model="m", messages=messages, temperature=0, response_format=Review
    )
    assert again.choices[0].message.content == text
    usage = again.usage
    assert usage.prompt_tokens == len(prompt)
    assert usage.completion_tokens == len(
        reference.tokenizer.encode(text, add_special_tokens=False)
    )
    assert usage.prompt_tokens_details.cached_tokens == len(prompt)  # the first one's prompt
    assert usage.model_extra["computed_tokens"] < len(prompt)  # the fields' tokens, a few


def test_regex_alternation_and_a_bare_enum_schema(client, reference):
    prompt = "Review: fine.\nSentiment:"
    answer = client.completions.create(
        model="m", prompt=prompt, temperature=0, extra_body={"regex": "^( good| bad)$"}
    )
    ids = reference.tokenizer.encode(prompt)
    text, (probabilities,) = constrained_greedy(reference, ids, [[" good", " bad"]])
    assert answer.choices[0].text == text
    assert_close(answer.choices[0].model_extra["choice_probabilities"], probabilities)
    schema = {"enum": ["A", "B", 3]}  # a bare enum: the JSON value itself
    answer = client.chat.completions.create(
        model="m", messages=chat("ok"), temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )  # fmt: skip
    assert json.loads(answer.choices[0].message.content) in ["A", "B", 3]
    assert set(answer.choices[0].model_extra["choice_probabilities"]) == {"A", "B", "3"}


def test_sampled_answers_are_seeded_choices(client):
    def ask(seed):
        return client.chat.completions.create(
            model="m", messages=chat("hmm"), temperature=1.0, seed=seed, n=6,
            extra_body={"structured_outputs": {"choice": SENTIMENTS}},
        )  # fmt: skip

    first, again = ask(7), ask(7)
    texts = [c.message.content for c in first.choices]
    assert set(texts) <= set(SENTIMENTS) and len(texts) == 6
    assert texts == [c.message.content for c in again.choices]


def test_streamed_choice_request_is_one_chunk_with_probabilities(server):
    body = {
        "model": "m", "messages": chat("good"), "temperature": 0, "stream": True,
        "guided_choice": SENTIMENTS, "stream_options": {"include_usage": True},
    }  # fmt: skip
    with requests.post(f"{server.url}/v1/chat/completions", json=body, stream=True) as r:
        assert r.status_code == 200
        lines = [x for x in r.iter_lines() if x]
    events = [json.loads(x[len(b"data: ") :]) for x in lines if x != b"data: [DONE]"]
    assert lines[-1] == b"data: [DONE]"
    first = events[0]["choices"][0]
    assert first["delta"]["content"] in SENTIMENTS
    assert set(first["choice_probabilities"]) == set(SENTIMENTS)
    assert events[-1]["usage"]["prompt_tokens"] > 0


def test_outside_the_shape_keeps_sglang_grammar_path(client):
    """A free string field, and a choice with logit_bias (which scoring cannot honour):
    decoded by SGLang under its grammar, no choice_probabilities."""
    schema = {
        "type": "object",
        "properties": {"sentiment": {"enum": ["a", "b"]}, "reason": {"type": "string"}},
        "required": ["sentiment", "reason"],
    }
    answer = client.chat.completions.create(
        model="m", messages=chat("ok"), temperature=0, max_tokens=12,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
    )  # fmt: skip
    choice = answer.choices[0]
    assert "choice_probabilities" not in (choice.model_extra or {})
    assert choice.message.content.lstrip().startswith("{")  # the grammar's, truncated at 12
    answer = client.chat.completions.create(
        model="m", messages=chat("ok"), temperature=0, logit_bias={"5": 1.0},
        extra_body={"structured_outputs": {"choice": ["positive", "negative"]}},
    )  # fmt: skip
    choice = answer.choices[0]
    assert "choice_probabilities" not in (choice.model_extra or {})
    assert choice.message.content in ("positive", "negative")  # SGLang's regex, translated


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"guided_choice": ["a"], "regex": "a|b"}, "give one structured-output constraint"),
        ({"structured_outputs": {"choices": ["a"]}}, "unknown fields ['choices']"),
        ({"structured_outputs": {"choice": []}}, "non-empty list"),
        ({"guided_choice": ["a", "a"]}, "repeated: ['a']"),
        ({"guided_choice": ["a", " "]}, "blank"),
        ({"response_format": "json"}, "response_format must be an object"),  # was SGLang's 500
        ({"response_format": {"type": "json_schema", "schema": 3}}, "schema must be an object"),
    ],
)
def test_bad_choice_requests_are_400s_naming_the_problem(client, extra, message):
    with pytest.raises(BadRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        client.chat.completions.create(model="m", messages=chat("x"), extra_body=extra)


def test_a_choice_request_with_an_image_on_a_text_model_is_a_400(server):
    """Images are scored on a vision-language model (tests/test_images_server.py); this
    model reads text only: refused naming it, the server alive after."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "Red?"}]}]
    body = {"model": "m", "messages": messages, "guided_choice": ["Yes", "No"]}
    answer = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 400 and "only supports text input" in answer.text, answer.text
    alive = {**body, "messages": chat("ok")}
    assert requests.post(f"{server.url}/v1/chat/completions", json=alive).status_code == 200
