"""What a DSL function and /v1/classify do with a model's classification head, without an
engine (dsl/head_route.py, apis/classify.py): the label order, the refusals by name, and
the admission count of a head-backed /v1/classify."""

from __future__ import annotations

import pytest

import prefillonly_sgl as prefillonly
from prefillonly_sgl import InvalidRequestError
from prefillonly_sgl.apis.classify import no_classifier_endpoint
from prefillonly_sgl.dsl.head_route import head_label_order

CLASSES = ("negative", "neutral", "positive")


def test_the_functions_labels_map_to_the_heads_classes_in_its_own_order():
    @prefillonly.classifier(labels=["positive", "negative", "neutral"])
    def sentiment(text: str) -> str:
        return text

    assert head_label_order(sentiment, CLASSES) == [2, 0, 1]


def test_refusals_name_the_problem():
    @prefillonly.classifier(labels=["good", "bad"])
    def other(text: str) -> str:
        return text

    with pytest.raises(InvalidRequestError, match=r"\['good', 'bad'\] are not the model's"):
        head_label_order(other, CLASSES)
    with pytest.raises(InvalidRequestError, match="one output \\(a reward score, 'reward'\\)"):
        head_label_order(other, ("reward",))

    @prefillonly.classifier(labels=list(CLASSES), normalize=False)
    def raw(text: str) -> str:
        return text

    with pytest.raises(InvalidRequestError, match="normalize=True"):
        head_label_order(raw, CLASSES)


def test_a_setwise_ranker_is_refused_on_a_head():
    @prefillonly.ranker(labels=list(CLASSES), score="positive", setwise="<|endoftext|>")
    def shortlist(profile: str, item: str) -> str:
        return profile + item

    with pytest.raises(InvalidRequestError, match="rank pointwise"):
        shortlist.compile_arguments(None, [{"profile": "p", "item": "i"}], None, head=True)


def test_a_head_backed_classify_counts_each_input_for_admission():
    count = no_classifier_endpoint().count_prompts
    assert count({"input": ["a", "b", "c"]}) == 3
    assert count({"input": [1, 2, 3]}) == 1  # one text as token ids
    assert count({"input": "a"}) == 1
