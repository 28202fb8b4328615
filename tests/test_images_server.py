"""/v1/score with images on a real `prefillonly serve` of the tiny Qwen2.5-VL (issue 86):
`image_data` (the query's images) and `item_image_data` (per item) as data URLs or URLs
of a real HTTP server on localhost, SGLang's answer shape, probabilities within 1e-4 of
transformers through the model's own processor; a bad image a 400 naming it, the server
alive after it. (Stock SGLang's /v1/score drops an image_data silently.) The same server
answers OpenAI's chat door (one-token requests and choice requests with `image_url`
parts) and /v1/classify with images (its --classify classifier, IMAGES_APP)."""

from __future__ import annotations

import base64

import pytest
import requests
from file_server import serving
from server_process import running_server
from test_images_engine import PLACEHOLDER, QUERY, _png

from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.verification.image_reference import ImageReference

pytestmark = pytest.mark.slow  # its own server (the tiny vision-language model)

TOLERANCE = 1e-4
ITEMS = ["Is it a red shoe? Answer:", "Is it a blue bag? Answer:"]
# /v1/classify's classifier: its input is the rendered chat, the whole prompt's item
IMAGES_APP = """
import prefillonly_sgl as prefillonly


@prefillonly.classifier(labels=["Yes", "No"])
def photo_answer(chat: str) -> str:
    return chat
"""


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory):
    path = build_family("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    folder = tmp_path_factory.mktemp("vl-server")
    (folder / "images_app.py").write_text(IMAGES_APP)
    app = ("--app", str(folder / "images_app.py"), "--classify", "photo_answer")
    with running_server(path, folder / "serve.log", *app) as server:
        server.reference = ImageReference(path)
        tok = server.reference.processor.tokenizer
        server.labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
        yield server


@pytest.fixture(scope="module")
def image_url(tmp_path_factory):
    folder = tmp_path_factory.mktemp("served-images")
    (folder / "a.png").write_bytes(_png(31))

    with serving(folder) as url:
        yield f"{url}/a.png"


def _score(server, **body):
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": server.labels, **body}
    return requests.post(f"{server.url}/v1/score", json=body, timeout=120)


def test_the_querys_image_by_data_url_and_url_as_transformers(vl_server, image_url):
    image = _png(30)
    answer = _score(vl_server, image_data=_data_url(image), apply_softmax=False)
    assert answer.status_code == 200, answer.text
    content = answer.json()
    assert content["object"] == "scoring" and len(content["scores"]) == len(ITEMS)
    for item, row in zip(ITEMS, content["scores"], strict=True):
        want = vl_server.reference.label_probabilities(
            PLACEHOLDER + QUERY + item, [image], vl_server.labels, False
        )
        assert row == pytest.approx(want, abs=TOLERANCE)
    by_url = _score(vl_server, image_data=[image_url], apply_softmax=False).json()
    first = vl_server.reference.label_probabilities(
        PLACEHOLDER + QUERY + ITEMS[0], [_png(31)], vl_server.labels, False
    )
    assert by_url["scores"][0] == pytest.approx(first, abs=TOLERANCE)
    # the repeat reads the query's image from the cache
    again = _score(vl_server, image_data=[image_url], apply_softmax=False).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 16 * len(ITEMS)


def test_per_item_images(vl_server):
    own = [_png(32), _png(33)]
    images = [[_data_url(own[0])], [_data_url(own[1])]]
    answer = _score(vl_server, item_image_data=images, apply_softmax=True)
    assert answer.status_code == 200, answer.text
    for k, (item, row) in enumerate(zip(ITEMS, answer.json()["scores"], strict=True)):
        want = vl_server.reference.label_probabilities(
            QUERY + PLACEHOLDER + item, [own[k]], vl_server.labels, True
        )
        assert row == pytest.approx(want, abs=TOLERANCE)


@pytest.mark.parametrize(
    "body, problem",
    [
        ({"image_data": "data:image/png;base64,AAAA"}, "images\\[0\\]: not a decodable image"),
        ({"image_data": "/etc/passwd"}, "an http\\(s\\) URL or a data URL"),
        ({"image_data": "http://127.0.0.1:9/a.png"}, "images\\[0\\]: cannot fetch"),
        ({"item_image_data": [[]]}, "item_images has 1 entries for 2 items"),
        ({"image_data": [_data_url(_png(1))] * 17}, "at most 16 images"),
    ],
)
def test_bad_images_are_400s_naming_them(vl_server, body, problem):
    import re

    answer = _score(vl_server, **body)
    assert answer.status_code == 400, answer.text
    assert re.search(problem, answer.text)
    assert _score(vl_server).status_code == 200  # alive, text calls as ever


def test_the_openai_chat_door_reads_an_image_url_in_a_one_token_request(vl_server):
    """OpenAI's client, an image_url part: a one-token request (prefill-only) whose label
    logprobs (logprob_token_ids) are transformers' on the chat template's prompt; the
    messages before the last are the reusable prefix (single_token/prefix.py), so the
    next question about the image reads it from the prefix cache."""
    import math

    import openai

    client = openai.OpenAI(base_url=f"{vl_server.url}/v1", api_key="none")
    image = _png(5)
    photo = [{"type": "image_url", "image_url": {"url": _data_url(image)}},
             {"type": "text", "text": "A product photo."}]  # fmt: skip
    reference = vl_server.reference
    cached = []
    for question in ("Is it red? Answer Yes or No.", "Is it a shoe? Answer Yes or No."):
        messages = [{"role": "user", "content": photo}, {"role": "user", "content": question}]
        prompt = reference.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, photo[1]]},
             {"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=False,
        )  # fmt: skip
        want = reference.label_probabilities(prompt, [image], vl_server.labels, False)
        answer = client.chat.completions.create(
            model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
            extra_body={"logprob_token_ids": vl_server.labels},
        )  # fmt: skip
        rows = answer.choices[0].logprobs.content[0].top_logprobs  # the labels', then sampled
        got = [math.exp(t.logprob) for t in rows[: len(vl_server.labels)]]
        assert got == pytest.approx(want, abs=TOLERANCE)
        cached.append(answer.usage.prompt_tokens_details.cached_tokens)
    first = reference.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, photo[1]]}], tokenize=False
    )
    # the first message, its image expanded: all of it but the template's last token
    assert cached[1] >= reference.expanded_length(first, [image]) - 1


def test_score_labels_with_an_image(vl_server):
    image = _png(41)
    body = {"query": QUERY, "items": ITEMS, "labels": [" Yes", " No"],
            "image_data": [_data_url(image)]}  # fmt: skip
    answer = requests.post(f"{vl_server.url}/v1/score_labels", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    for item, row in zip(ITEMS, answer.json()["rows"], strict=True):
        want = vl_server.reference.label_probabilities(
            PLACEHOLDER + QUERY + item, [image], vl_server.labels, True
        )
        assert row == pytest.approx(want, abs=TOLERANCE)
    bad = requests.post(f"{vl_server.url}/v1/score_labels", timeout=120,
                        json={**body, "image_data": "/etc/hostname"})  # fmt: skip
    assert bad.status_code == 400 and "http(s) URL or a data URL" in bad.text


def test_a_dsl_classifier_with_an_image_through_a_remote_backend(vl_server, tmp_path):
    """The DSL on the server: the image (a local path here) is loaded by the client and
    sent as a data URL to /v1/score_labels."""
    from test_images_engine import photo_is

    import prefillonly_sgl as prefillonly

    image = _png(61)
    path = tmp_path / "photo.png"
    path.write_bytes(image)
    backend = prefillonly.RemoteBackend(vl_server.url)
    result = photo_is(str(path), "a red shoe", engine=backend)
    prompt = PLACEHOLDER + QUERY + "Is it a red shoe? Answer:"
    want = vl_server.reference.label_probabilities(prompt, [image], vl_server.labels, True)
    assert [result.probs[" Yes"], result.probs[" No"]] == pytest.approx(want, abs=TOLERANCE)


def _photo_chat(reference, image: bytes, question: str):
    """(OpenAI's messages: the photo (an image_url part) then the question, the chat
    template's prompt for transformers: the image part as the template's placeholder).
    The photo's message is the reusable prefix (the query of the choice's score calls)."""
    photo = {"type": "text", "text": "A product photo."}
    messages = [
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _data_url(image)}}, photo]},
        {"role": "user", "content": question},
    ]  # fmt: skip
    prompt = reference.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, photo]}, messages[1]],
        add_generation_prompt=True,
        tokenize=False,
    )
    return messages, prompt


def _sequence_logprobs(reference, prompt: str, images, choices: list[list[int]]) -> list[float]:
    """Each choice's log-probability after the prompt by the chain rule: one transformers
    forward of the processed prompt (its image expanded) with the choice's tokens after."""
    import torch

    out = []
    for tokens in choices:
        inputs = dict(reference.inputs(prompt, images))
        n = inputs["input_ids"].shape[1]
        for key, value in inputs.items():  # per-position tensors: the choice's tokens after
            if torch.is_tensor(value) and value.shape == (1, n):
                more = {"input_ids": torch.tensor([tokens]), "attention_mask": 1}.get(key, 0)
                more = more if torch.is_tensor(more) else torch.full((1, len(tokens)), more)
                inputs[key] = torch.cat([value, more.to(value.dtype)], 1)
        with torch.no_grad():
            logits = reference.model(**inputs).logits[0].double()
        logprobs = torch.log_softmax(logits[n - 1 : n - 1 + len(tokens)], -1)
        out.append(sum(float(logprobs[j, t]) for j, t in enumerate(tokens)))
    return out


@pytest.mark.parametrize(
    "choices, field",
    [(["Yes", "No"], "structured_outputs"), (["red", "blue", "mixed feelings"], "guided_choice")],
)
def test_the_openai_client_with_an_image_url_part_gets_its_choice_and_its_probabilities(
    vl_server, choices, field
):
    """A choice request with an image is scored (not SGLang's grammar path: it gives no
    probabilities): each choice's probability is transformers' chain rule on the
    processed prompt (one-token answers, and answers of several tokens, which continue
    as text behind the image), the answer the constrained greedy one."""
    import math

    import openai

    reference = vl_server.reference
    tok = reference.processor.tokenizer
    image = _png(71)
    messages, prompt = _photo_chat(reference, image, "What is it? Answer in one word.")
    client = openai.OpenAI(base_url=f"{vl_server.url}/v1", api_key="none")
    body = {"structured_outputs": {"choice": choices}} if field == "structured_outputs" else {
        "guided_choice": choices}  # fmt: skip
    answer = client.chat.completions.create(
        model="m", messages=messages, temperature=0, extra_body=body
    )
    choice = answer.choices[0]
    tokens = [tok.encode(c, add_special_tokens=False) for c in choices]
    sequences = _sequence_logprobs(reference, prompt, [image], tokens)
    top = max(sequences)
    weights = [math.exp(x - top) for x in sequences]
    want = {c: w / sum(weights) for c, w in zip(choices, weights, strict=True)}
    got = choice.model_extra["choice_probabilities"]
    assert set(got) == set(want)
    assert max(abs(got[c] - want[c]) for c in choices) < TOLERANCE, (got, want)
    # greedy under the constraint: the choices' first tokens differ, so the likeliest
    # first token decides
    first = _sequence_logprobs(reference, prompt, [image], [t[:1] for t in tokens])
    assert choice.message.content == choices[first.index(max(first))]
    assert answer.usage.prompt_tokens == reference.expanded_length(prompt, [image])
    if field == "structured_outputs":  # the next question about the photo: from the cache
        again, _ = _photo_chat(reference, image, "Is it red? Answer Yes or No.")
        second = client.chat.completions.create(
            model="m", messages=again, temperature=0, extra_body=body
        )
        photo = reference.processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, messages[0]["content"][1]]}],
            tokenize=False,
        )
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached >= reference.expanded_length(photo, [image]) - 1


@pytest.mark.parametrize(
    "url, problem",
    [
        ("data:image/png;base64,AAAA", "messages\\[0\\].content\\[0\\]: not a decodable image"),
        ("http://127.0.0.1:9/a.png", "messages\\[0\\].content\\[0\\]: cannot fetch"),
    ],
)
def test_a_bad_image_in_a_choice_request_or_a_classify_chat_is_a_400_naming_it(
    vl_server, url, problem
):
    import re

    parts = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "Red?"}]
    messages = [{"role": "user", "content": parts}]
    chat = {"model": "m", "messages": messages, "guided_choice": ["Yes", "No"]}
    classify = {"messages": messages, "add_generation_prompt": True}
    for path, body in (("/v1/chat/completions", chat), ("/v1/classify", classify)):
        answer = requests.post(f"{vl_server.url}{path}", json=body, timeout=120)
        assert answer.status_code == 400, answer.text
        assert re.search(problem, answer.text), answer.text
    assert _score(vl_server).status_code == 200  # alive


def test_classify_a_chat_with_an_image(vl_server):
    """/v1/classify's messages with an image_url part: the chat rendered by the template
    (the image part its placeholder) is the classifier's input, the image goes where
    the placeholder landed; probabilities within 1e-4 of transformers."""
    reference = vl_server.reference
    tok = reference.processor.tokenizer
    image = _png(72)
    messages, prompt = _photo_chat(reference, image, "Is it red? Answer Yes or No.")
    body = {"messages": messages, "add_generation_prompt": True}
    answer = requests.post(f"{vl_server.url}/v1/classify", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    (data,) = answer.json()["data"]
    labels = [tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No")]
    want = reference.label_probabilities(prompt, [image], labels, True)
    assert data["probs"] == pytest.approx(want, abs=TOLERANCE)
    assert data["label"] == ("Yes" if want[0] > want[1] else "No")


def test_a_chats_images_go_where_the_classifiers_prompt_put_their_placeholders():
    """Plain: /v1/classify's placement (apis/classify_images.py), no server."""
    from prefillonly_sgl.apis.classify_images import (
        chat_with_images,
        check_placeholders,
        split_images,
    )
    from prefillonly_sgl.dsl.prompt import Prompt
    from prefillonly_sgl.scoring.errors import InvalidRequestError
    from prefillonly_sgl.scoring.image_prompts import ImagePlaceholder

    mark = ImagePlaceholder("<img>", 7)
    assert split_images(Prompt("a<img>", "b<img>c"), [b"1", b"2"], mark) == ((b"1",), (b"2",))
    assert split_images(Prompt("a", "<img><img>"), [b"1", b"2"], mark) == ((), (b"1", b"2"))
    with pytest.raises(InvalidRequestError, match="does not hold the chat's image"):
        split_images(Prompt("a", "<img><img>"), [b"1"], mark)  # the chat taken twice
    with pytest.raises(InvalidRequestError, match="images of its own"):
        split_images(Prompt("a", "<img>", images=(b"0",)), [b"1"], mark)
    with pytest.raises(InvalidRequestError, match="holds 0 image placeholder"):
        check_placeholders("cut", 1, mark)
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]
    with pytest.raises(InvalidRequestError, match=r"messages\[0\].content\[0\]: images need"):
        chat_with_images(messages, None, None)
    with pytest.raises(InvalidRequestError, match=r"content\[0\]: only on Triton"):
        chat_with_images(messages, mark, "only on Triton")
    assert chat_with_images([{"role": "user", "content": "hi"}], None, None)[1] == []
