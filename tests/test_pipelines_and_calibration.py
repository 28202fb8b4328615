"""Contextual calibration and the three pipelines on a real Engine (tiny random Llama,
float32): calibrated probabilities equal the plain ones divided by the content-free prior
(computed here from plain DSL calls), the prior is measured once per engine and context,
and each pipeline runs end to end through the batch runner on its real data (small
limits: the tiny model's quality is random, so only the shapes of the metrics are checked)."""

from __future__ import annotations

import pytest
from conftest import counting_backend, max_abs_diff

from prefillonly_sgl import Prompt, classifier
from prefillonly_sgl.dsl import DeclarationError, contextual_calibration
from prefillonly_sgl.pipelines import credit, drug_review_labeling, movielens

EXAMPLES = "Review: this medicine worked well\nSentiment: positive\n\n"
REVIEWS = ["I feel much better now", "would not take it again", "ok"]


def prompt(review: str, examples: str) -> Prompt:
    return Prompt(prefix=examples, item=f"Review: {review}\nSentiment:")


plain = classifier(labels=["positive", "negative"])(prompt)
calibrated = classifier(labels=["positive", "negative"], calibrate="review")(prompt)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine  # conftest: one per session


def rows(results):
    return [[r.probs["positive"], r.probs["negative"]] for r in results]


def test_calibration_divides_out_the_content_free_prior_measured_once(engine):
    inputs = [(r, EXAMPLES) for r in REVIEWS]
    free = [(text, EXAMPLES) for text in contextual_calibration.CONTENT_FREE]
    prior = contextual_calibration.average(rows(plain.batch(free, engine=engine, progress=False)))
    uncalibrated = rows(plain.batch(inputs, engine=engine, progress=False))
    want = [contextual_calibration.divide_prior(r, prior) for r in uncalibrated]
    backend = counting_backend(engine)
    got = rows(calibrated.batch(inputs, engine=backend, progress=False))
    assert max_abs_diff(got, want) < 1e-6
    assert max_abs_diff(got, uncalibrated) > 1e-4
    # Calibration is a transform of the job: the content-free inputs went out in the same
    # request as the reviews, behind the same prefix.
    assert len(backend.requests) == 1
    assert backend.items_sent == len(REVIEWS) + len(contextual_calibration.CONTENT_FREE)
    # The prior is the backend's now: only the input goes out, for a call as for a batch.
    calibrated("ok", EXAMPLES, engine=backend)
    assert backend.items_sent == len(REVIEWS) + len(contextual_calibration.CONTENT_FREE) + 1
    # Another context (other few-shot examples) has its own prior.
    sent = backend.items_sent
    calibrated("ok", "Review: bad\nSentiment: negative\n\n", engine=backend)
    assert backend.items_sent == sent + 1 + len(contextual_calibration.CONTENT_FREE)


def test_calibration_declarations_name_the_content():
    with pytest.raises(DeclarationError, match="calibrate=True needs a one-parameter"):
        classifier(labels=["positive", "negative"], calibrate=True)(prompt)
    with pytest.raises(DeclarationError, match="must name parameters"):
        classifier(labels=["positive", "negative"], calibrate="text")(prompt)
    with pytest.raises(DeclarationError, match="normalize=True"):
        classifier(labels=["positive", "negative"], calibrate="review", normalize=False)(prompt)
    assert contextual_calibration.divide_prior([0.5, 0.5], [0.8, 0.2]) == pytest.approx([0.2, 0.8])


def in_unit_interval(values: dict) -> bool:
    return all(0.0 <= v <= 1.0 for v in values.values())


def test_credit_pipeline_end_to_end(engine, tmp_path):
    report = credit.run(limit=8, shots=2, engine=engine, out=tmp_path, progress=False)
    assert report["applicants"] == 8
    for name in ("plain", "calibrated"):
        assert 0 <= report[name]["accuracy"] <= 1 and 0 <= report[name]["roc_auc"] <= 1
        assert len((tmp_path / f"credit_{name}.jsonl").read_text().splitlines()) == 8
    assert report["plain"]["cache_hit_share"] > 0  # the few-shot prefix is shared


def test_drug_review_labeling_end_to_end(engine, tmp_path):
    report = drug_review_labeling.run(limit=9, shots=1, engine=engine, out=tmp_path, progress=False)
    for name in ("plain", "calibrated"):
        matrix = report[name]["confusion"]
        assert len(matrix) == 3 and sum(map(sum, matrix)) == 9


def test_movielens_ranking_end_to_end(engine, tmp_path):
    report = movielens.run(users=3, negatives=3, profile_films=5, engine=engine, out=tmp_path,
                           progress=False)  # fmt: skip
    assert report["users"] == 3 and report["records"] == 12 and report["candidates"] == 4
    for system in ("model", "popularity", "random"):
        assert in_unit_interval(report[system]) and report[system]["hit@5"] == 1.0
    assert report["cache_hit_share"] > 0.2  # each profile computed once for its 4 films
