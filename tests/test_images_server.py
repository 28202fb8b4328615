"""/v1/score with images on a real `prefillonly serve` of the tiny Qwen2.5-VL (issue 86):
`image_data` (the query's images) and `item_image_data` (per item) as data URLs or URLs
of a real HTTP server on localhost, SGLang's answer shape, probabilities within 1e-4 of
transformers through the model's own processor; a bad image a 400 naming it, the server
alive after it. (Stock SGLang's /v1/score drops an image_data silently.)"""

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


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def vl_server(tmp_path_factory):
    path = build_family("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))
    log = tmp_path_factory.mktemp("vl-server") / "serve.log"
    with running_server(path, log) as server:
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
