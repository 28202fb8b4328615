"""Images in scoring on a Qwen3-VL (issue 86): a tiny dense Qwen3-VL in the published shape
(models/tiny_vl_checkpoints.py: patch 16, interleaved M-RoPE, deepstack mergers into
the first decoder layers, tied embeddings; a 32x32 image is resized to 256x256, 64 image
tokens), one engine for the module. Every probability against a plain transformers
forward of the same prompt and images through the model's own processor
(verification/image_reference.py), 1e-4 in float32; N items about one image in one
forward, and a repeat about it read from the prefix cache. (In transformers, on this
checkpoint and one of these prompts, dropping the deepstack features moved the softmax
probability by 0.07 and chunked instead of interleaved M-RoPE by 0.2: the comparison
sees both; measured 2026-11-28.)"""

from __future__ import annotations

import hashlib
import json

import pytest
from test_images_engine import _png, running_vl

from prefillonly_sgl.hooking.events import read_events

pytestmark = pytest.mark.slow  # a vision-language engine

TOLERANCE = 1e-4
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
QUERY = "<|im_start|>user\nA product photo. "
ITEMS = [
    "Is it a red shoe? Answer:",
    "Is it a blue bag? Answer:",
    "Is it something to wear? Answer:",
]
# Qwen3-VL-*-Instruct's chat_template.json (tiny_vl_checkpoints.QWEN3_VL_CHAT_TEMPLATE_FILE)
PUBLISHED_TEMPLATE_SHA256 = "3636d0f0bd6bef02654cdffdc447b79cb2cef8ab02cc75267345946291a489e4"


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    with running_vl("qwen3_vl", tmp_path_factory) as running:
        yield running


def test_the_tiny_checkpoint_is_in_the_published_shape(vl):
    *_, path = vl
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3VLForConditionalGeneration"]
    vision, text = config["vision_config"], config["text_config"]
    patches = [vision[k] for k in ("patch_size", "spatial_merge_size", "temporal_patch_size")]
    assert patches == [16, 2, 2] and vision["num_position_embeddings"] == 2304
    assert len(vision["deepstack_visual_indexes"]) == 3
    rope = text["rope_parameters"]
    assert rope["mrope_interleaved"] and 2 * sum(rope["mrope_section"]) == text["head_dim"]
    assert config["tie_word_embeddings"] and text["head_dim"] * 4 != text["hidden_size"]
    template = (path / "chat_template.jinja").read_bytes()
    assert hashlib.sha256(template).hexdigest() == PUBLISHED_TEMPLATE_SHA256
    processor = json.loads((path / "processor_config.json").read_text())
    assert processor["processor_class"] == "Qwen3VLProcessor"
    assert processor["image_processor"]["image_mean"] == [0.5, 0.5, 0.5]


@pytest.mark.parametrize("softmax", [False, True])
def test_an_image_in_the_query_scores_every_item_as_transformers(vl, softmax):
    engine, reference, labels, _ = vl
    image = _png(100 + softmax)  # a new image per case: the first call is cold
    result = engine.score(QUERY, ITEMS, labels, apply_softmax=softmax, images=[image])
    for item, row in zip(ITEMS, result.scores, strict=True):
        want = reference.label_probabilities(PLACEHOLDER + QUERY + item, [image], labels, softmax)
        assert row == pytest.approx(want, abs=TOLERANCE)


def test_n_items_about_one_image_are_one_forward_then_read_from_the_cache(vl):
    """The scheduler admits the call's prompts together: one computes the query and its
    image, the others ride behind it in the same forward; a later call about the same
    image reads the image's tokens and the query's from the prefix cache."""
    engine, reference, labels, _ = vl
    image = _png(121)
    items = [f"Is it item number {i}? Answer:" for i in range(6)]
    before = len(read_events(engine.forward_log, "forward"))
    engine.score(QUERY, items, labels, images=[image])
    forwards = read_events(engine.forward_log, "forward")[before:]
    assert len(forwards) == 1, forwards
    assert len(forwards[0]["new"]) == len(items) and forwards[0]["packed"] == len(items) - 1
    query_len = reference.expanded_length(PLACEHOLDER + QUERY, [image])
    assert query_len > 64  # the 64 image tokens and the text
    again = engine.score(QUERY, ITEMS, labels, apply_softmax=True, images=[image])
    assert again.cached_tokens >= len(ITEMS) * (query_len - 1)
    for item, row in zip(ITEMS, again.scores, strict=True):
        want = reference.label_probabilities(PLACEHOLDER + QUERY + item, [image], labels, True)
        assert row == pytest.approx(want, abs=TOLERANCE)


def test_each_item_its_own_image_beside_the_querys(vl):
    engine, reference, labels, _ = vl
    shared, own = _png(131), [_png(132), _png(133)]
    query = "Compare " + PLACEHOLDER + " with the next image: "
    items = ["this one " + PLACEHOLDER + " Same?", "and this? Same?"]
    result = engine.score(
        query, items, labels, apply_softmax=True, images=shared, item_images=[[own[0]], [own[1]]]
    )
    want0 = reference.label_probabilities(query + items[0], [shared, own[0]], labels, True)
    # the second item has no placeholder: its image goes first in the item
    want1 = reference.label_probabilities(
        query + PLACEHOLDER + items[1], [shared, own[1]], labels, True
    )
    assert result.scores[0] == pytest.approx(want0, abs=TOLERANCE)
    assert result.scores[1] == pytest.approx(want1, abs=TOLERANCE)
