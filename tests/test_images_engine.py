"""Images in scoring on the Engine (issue 86): a tiny Qwen2.5-VL in the published shape
(models/tiny_family_checkpoints.py, a 32x32 image is 16 image tokens), one engine for the
module. Every probability against a plain transformers forward of the same prompt and
image through the model's own processor (verification/image_reference.py), 1e-4 in
float32; the query's image computed once and then read from the prefix cache (its
expanded positions are the reusable prefix)."""

from __future__ import annotations

import contextlib
import math
import os

import pytest
from conftest import start_logging_forwards

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Engine
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.models.tiny_family_checkpoints import build_family
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.sglang_runtime.shared_image_features import SHARES_IMAGES
from prefillonly_sgl.verification.image_reference import ImageReference
from prefillonly_sgl.verification.probes import probe_image

pytestmark = pytest.mark.slow  # a vision-language engine

TOLERANCE = 1e-4
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
QUERY = "<|im_start|>user\nA product photo. "
ITEMS = [
    "Is it a red shoe? Answer:",
    "Is it a blue bag? Answer:",
    "Is it something to wear? Answer:",
]


def _png(seed: int) -> bytes:
    """A 32x32 image of seeded noise (every pixel matters to the vision tower)."""
    return probe_image(32, seed)


@contextlib.contextmanager
def running_vl(family: str, tmp_path_factory):
    """(engine, reference, " Yes" / " No" ids, path) of the tiny checkpoint of a
    vision-language ``family``: one Engine logging its forwards (engine.forward_log)."""
    path = build_family(family, tmp_path_factory.mktemp(family))
    reference = ImageReference(path)
    tok = reference.processor.tokenizer
    labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    log = tmp_path_factory.mktemp(f"{family}-forwards") / "forwards.log"
    engine = start_logging_forwards(
        log, lambda: Engine(path, device="cpu", dtype="float32", max_total_tokens=4096)
    )
    with engine:
        engine.forward_log = log
        yield engine, reference, labels, path


@pytest.fixture(scope="module")
def vl(tmp_path_factory):
    with running_vl("qwen2_5_vl", tmp_path_factory) as (engine, reference, labels, _):
        yield engine, reference, labels


@pytest.mark.parametrize("softmax", [False, True])
def test_an_image_in_the_query_scores_every_item_as_transformers(vl, softmax):
    engine, reference, labels = vl
    image = _png(softmax)  # a new image per case: the first call is cold
    result = engine.score(QUERY, ITEMS, labels, apply_softmax=softmax, images=[image])
    for item, row in zip(ITEMS, result.scores, strict=True):
        want = reference.label_probabilities(PLACEHOLDER + QUERY + item, [image], labels, softmax)
        assert row == pytest.approx(want, abs=TOLERANCE)


def test_n_items_about_one_image_are_one_forward_of_packed_items(vl):
    """SGLang sends prompts with images one by one (its processor runs per prompt); the
    scheduler admits the call's prompts together: one computes the query and its image,
    the others ride behind it in the same forward (features/jct_scheduler/call_arrival.py,
    prefill_kv packing)."""
    engine, _, labels = vl
    items = [f"Is it item number {i}? Answer:" for i in range(6)]
    before = len(read_events(engine.forward_log, "forward"))
    processed = engine.tokenizer_manager.mm_processor.mm_preprocess_cache
    misses, reused = processed.misses, processed.hits + processed.singleflight_joins
    engine.score(QUERY, items, labels, images=[_png(21)])
    forwards = read_events(engine.forward_log, "forward")[before:]
    assert len(forwards) == 1, forwards
    assert len(forwards[0]["new"]) == len(items) and forwards[0]["packed"] == len(items) - 1
    # SGLang's tokenizer side processed the image once; the other prompts took it from its
    # preprocess cache, or joined its processing in flight (on by default for
    # vision-language families with our features: config/runtime_config.py)
    reused = processed.hits + processed.singleflight_joins - reused
    assert (processed.misses - misses, reused) == (1, len(items) - 1)


def test_a_calls_prompts_name_one_shared_segment_of_their_image(vl):
    """SGLang copies a prompt's processed image into a segment of its own; the prompts of
    a call (and of the next call) about one image name one segment, written once
    (sglang_runtime/shared_image_features.py), which stays while the engine runs."""
    engine, reference, labels = vl
    registry = getattr(engine.tokenizer_manager, SHARES_IMAGES)
    before = len(registry)
    image = _png(71)
    first = engine.score(QUERY, ITEMS, labels, images=[image])
    assert len(registry) == before + 1
    again = engine.score(QUERY, ITEMS[::-1], labels, images=[image])
    assert len(registry) == before + 1  # the same image: the same segment
    for item, row, row_again in zip(ITEMS, first.scores, again.scores[::-1], strict=True):
        want = reference.label_probabilities(PLACEHOLDER + QUERY + item, [image], labels, True)
        assert row == pytest.approx(want, abs=TOLERANCE)
        assert row_again == pytest.approx(want, abs=TOLERANCE)
    assert all(os.path.exists(f"/dev/shm/{p.shm_name}") for p in registry.handles())
    # a segment unlinked from outside (another container's sweep) is written anew
    gone = registry.handles()[-1]
    gone.unlink()
    third = engine.score(QUERY, ITEMS, labels, images=[image])
    for row, row_first in zip(third.scores, first.scores, strict=True):
        assert row == pytest.approx(row_first, abs=TOLERANCE)
    assert registry.handles()[-1].shm_name != gone.shm_name
    assert os.path.exists(f"/dev/shm/{registry.handles()[-1].shm_name}")


def test_the_querys_image_is_read_from_the_cache_by_later_items(vl):
    """The query's expanded image is its reusable prefix: new items about the same image
    read it (and the query's text) from the prefix cache."""
    engine, reference, labels = vl
    image = _png(7)
    engine.score(QUERY, ITEMS[:1], labels, images=[image])
    query_len = reference.expanded_length(PLACEHOLDER + QUERY, [image])
    assert query_len > 16  # the 16 image tokens and the text
    again = engine.score(QUERY, ITEMS[1:], labels, images=[image])
    assert again.cached_tokens >= len(ITEMS[1:]) * (query_len - 1)
    other = engine.score(QUERY, ITEMS[1:], labels, images=[_png(8)])  # another image
    assert other.cached_tokens < again.cached_tokens


def test_labels_of_several_tokens_about_an_image_by_the_chain_rule(vl):
    """Labels of several tokens: each continuation is read behind the prompt's text and
    its image again (the image and the prompt from the prefix cache), the label's tokens
    as text that tokenizes back to them; against transformers' chain rule on the
    processed prompt then the label's tokens."""
    engine, reference, _ = vl
    tok = reference.processor.tokenizer
    labels = [tok.encode(w, add_special_tokens=False) for w in (" Yes", " No", " not sure")]
    assert max(len(label) for label in labels) > 1
    image = _png(61)
    result = engine.score(QUERY, ITEMS[:2], labels, apply_softmax=True, images=[image])
    for item, row in zip(ITEMS[:2], result.scores, strict=True):
        logprobs = reference.sequence_logprobs(PLACEHOLDER + QUERY + item, [image], labels)
        total = sum(math.exp(x) for x in logprobs)
        want = [math.exp(x) / total for x in logprobs]
        assert row == pytest.approx(want, abs=TOLERANCE)
    with pytest.raises(InvalidRequestError, match="item_first"):
        engine.score(QUERY, ITEMS[:1], labels, item_first=True, images=[image])


def test_each_item_its_own_image_and_placeholders_where_written(vl):
    engine, reference, labels = vl
    shared, own = _png(11), [_png(12), _png(13)]
    query = "Compare " + PLACEHOLDER + " with the next image: "
    items = ["this one " + PLACEHOLDER + " Same?", "and this? Same?"]
    item_images = [[own[0]], [own[1]]]
    result = engine.score(
        query, items, labels, apply_softmax=False, images=shared, item_images=item_images
    )
    want0 = reference.label_probabilities(query + items[0], [shared, own[0]], labels, False)
    # the second item has no placeholder: its image goes first in the item
    want1 = reference.label_probabilities(
        query + PLACEHOLDER + items[1], [shared, own[1]], labels, False
    )
    assert result.scores[0] == pytest.approx(want0, abs=TOLERANCE)
    assert result.scores[1] == pytest.approx(want1, abs=TOLERANCE)


def test_bad_image_calls_are_refused_by_name(vl, tmp_path):
    engine, _, labels = vl
    with pytest.raises(InvalidRequestError, match="images\\[0\\]: not a decodable image"):
        engine.score(QUERY, ITEMS, labels, images=[b"not an image"])
    with pytest.raises(InvalidRequestError, match="cannot read"):
        engine.score(QUERY, ITEMS, labels, images=[str(tmp_path / "missing.png")])
    with pytest.raises(InvalidRequestError, match="2 image placeholder"):
        engine.score(PLACEHOLDER * 2 + QUERY, ITEMS, labels, images=[_png(1)])
    with pytest.raises(InvalidRequestError, match="item_images has 1 entries for 3 items"):
        engine.score(QUERY, ITEMS, labels, item_images=[[_png(1)]])
    # the engine serves on: a good call after the refusals
    path = tmp_path / "ok.png"
    path.write_bytes(_png(2))
    assert len(engine.score(QUERY, ITEMS, labels, images=str(path)).scores) == 3


def test_a_text_model_refuses_images(tiny_engine, yes_no_labels):
    with pytest.raises(InvalidRequestError, match="reads text only"):
        tiny_engine.score("q", ["i"], yes_no_labels, images=[_png(1)])


@prefillonly.classifier(labels=[" Yes", " No"])
def photo_is(photo: str | bytes, what: str) -> prefillonly.Prompt:
    return prefillonly.Prompt(prefix=QUERY, item=f"Is it {what}? Answer:", images=[photo])


def test_a_dsl_classifier_with_an_image_argument(vl):
    """The function's Prompt carries the image (shared by every input with this prefix and
    image: one request, the image computed once)."""
    engine, reference, labels = vl
    image = _png(51)
    whats = ["a red shoe", "a blue bag", "a green hat"]
    results = photo_is.batch([(image, w) for w in whats], engine=engine, progress=False)
    for what, result in zip(whats, results, strict=True):
        prompt = PLACEHOLDER + QUERY + f"Is it {what}? Answer:"
        want = reference.label_probabilities(prompt, [image], labels, True)
        assert [result.probs[" Yes"], result.probs[" No"]] == pytest.approx(want, abs=TOLERANCE)
    # inputs about another image are another request (their prefixes' images differ)
    other = photo_is(_png(52), "a red shoe", engine=engine)
    assert other.probs != results[0].probs


def test_verify_holds_the_image_path_to_transformers(vl):
    """`prefillonly verify` on a vision-language model asks its images probe too (the
    items about an image, cold and then from the prefix cache) against transformers
    through the model's own processor; here on this module's engine, which has every
    feature on as verify's first variant."""
    from prefillonly_sgl.verification.verify import verify

    engine = vl[0]
    report = verify(
        engine.config.model_path,
        variants=["all features"],
        engines={"all features": engine},
        progress=lambda line: None,
    )
    images = report.results[0].checks["images"]
    assert images.applies and images.ok and images.max_diff is not None, images
    assert report.feature_summary()["images"]["status"] == "pass"
    assert report.ok, report.table()


@prefillonly.ranker(labels=[" Yes", " No"], score=" Yes")
def photos_match(photo: bytes, item: str) -> prefillonly.Prompt:
    return prefillonly.Prompt(prefix=QUERY, item=f"{item} Answer:", images=[photo])


def test_a_dsl_ranker_ranks_items_about_an_image(vl):
    """A pointwise @ranker whose prefix carries the image: the items ranked by P(" Yes")
    normalised over the labels, each as transformers scores it."""
    engine, reference, labels = vl
    image = _png(81)
    items = ["Is it a red shoe?", "Is it a blue bag?", "Is it a green hat?"]
    ranking = photos_match(image, items=items, engine=engine)
    want = {
        item: reference.label_probabilities(
            PLACEHOLDER + QUERY + f"{item} Answer:", [image], labels, True
        )[0]
        for item in items
    }
    assert [r.item for r in ranking.items] == sorted(items, key=want.get, reverse=True)
    for r in ranking.by_input:
        assert r.score == pytest.approx(want[r.item], abs=TOLERANCE)
