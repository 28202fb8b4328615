"""Classification heads through the prefill-only runtime (issue 76): tiny
`*ForSequenceClassification` checkpoints of Llama, Qwen2 and Qwen3 (models/tiny_heads.py,
float32) start with every feature on and answer Engine.score without labels, each item's
class probabilities within 1e-4 of transformers' AutoModelForSequenceClassification; on
the Llama head the query is computed once (its items packed behind it in one forward),
kept by prefill-only KV and read from the cache the second time (cached_tokens), the
items' own tokens never cached; temperature, raw logits, pooled hidden states and a reward
model (one label) as SGLang answers them; labels and a reward model's softmax refused.
"""

from __future__ import annotations

import pytest
import requests
import torch
from conftest import max_abs_diff, start_logging_forwards

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Engine, Prompt
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.models.tiny_heads import SENTIMENT, build_tiny_head
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4  # float32 engine vs float32 transformers
QUERY = list(range(20, 120))  # a shared 100-token prefix (token ids of the tiny vocabulary)
ITEMS = [[130, 131], [140, 141, 142], [150]]


def _engine(path, **kwargs):
    return Engine(path, device="cpu", dtype="float32", max_total_tokens=4096, **kwargs)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """The Llama head's engine, logging its forwards."""
    path = build_tiny_head(tmp_path_factory.mktemp("head-llama"), "llama")
    log = tmp_path_factory.mktemp("head-log") / "forwards.log"
    engine = start_logging_forwards(log, lambda: _engine(path))
    with engine:
        yield engine, TransformersReference(str(path)), log


def test_a_head_starts_with_the_features_and_names_its_classes(llama):
    engine, _, _ = llama
    assert engine.model_family == "llama"
    assert engine.class_labels == SENTIMENT
    assert {"prefill_kv", "jct_scheduler", "prefill_attention"} <= set(engine.features)
    assert engine.prefill_only_kv_active


def test_class_probabilities_equal_transformers_and_the_query_is_computed_once(llama):
    """A cold query and its three items in one forward (the query computed once, the
    others packed behind it), then the same call again reading the query from the cache
    and computing only each item's own tokens."""
    engine, ref, log = llama
    want = ref.class_scores(QUERY, ITEMS)
    for round_ in range(2):
        before = len(read_events(log, "forward"))
        result = engine.score(QUERY, ITEMS)
        forwards = read_events(log, "forward")[before:]
        assert max_abs_diff(result.scores, want) < TOLERANCE
        assert all(sum(row) == pytest.approx(1.0, abs=1e-6) for row in result.scores)
        assert len(forwards) == 1
        if round_ == 0:
            assert forwards[0]["prefix"] == [0, len(QUERY), len(QUERY)]
            assert forwards[0]["packed"] == 2
        else:
            assert forwards[0]["prefix"] == [len(QUERY)] * 3  # never an item's own tokens
            assert result.cached_tokens == 3 * len(QUERY)


def test_logits_temperature_and_pooled_hidden_states(llama):
    """apply_softmax=False: the head's logits; a temperature divides them before the
    softmax; return_pooled_hidden_states: each item's last hidden state under the head."""
    engine, ref, _ = llama
    raw = engine.score(QUERY, ITEMS, apply_softmax=False, return_pooled_hidden_states=True)
    rows, states = ref.class_scores(QUERY, ITEMS, apply_softmax=False, hidden=True)
    assert max_abs_diff(raw.scores, rows) < TOLERANCE
    assert len(raw.pooled_hidden_states) == len(ITEMS)
    for got, want in zip(raw.pooled_hidden_states, states, strict=True):
        assert torch.as_tensor(got).double().sub(want).abs().max() < TOLERANCE
    warm = engine.score(QUERY, ITEMS, temperature=3.0)
    assert max_abs_diff(warm.scores, ref.class_scores(QUERY, ITEMS, temperature=3.0)) < TOLERANCE


def test_text_prompts_and_item_first(llama):
    engine, ref, _ = llama
    query, items = "Review: the medicine worked. Sentiment:", [" ok", " fine then"]
    assert max_abs_diff(engine.score(query, items).scores, ref.class_scores(query, items)) < (
        TOLERANCE
    )
    got = engine.score(query, items, item_first=True).scores
    assert max_abs_diff(got, ref.class_scores(query, items, item_first=True)) < TOLERANCE


def test_refusals_name_the_problem(llama):
    engine, _, _ = llama
    with pytest.raises(InvalidRequestError, match="give no label_token_ids"):
        engine.score(QUERY, ITEMS, [5, 6])
    with pytest.raises(InvalidRequestError, match="only supported for CausalLM"):
        engine.score(QUERY, ITEMS, return_token_logprobs=True)
    with pytest.raises(InvalidRequestError, match="temperature requires apply_softmax"):
        engine.score(QUERY, ITEMS, apply_softmax=False, temperature=2.0)
    assert engine.score(QUERY, []).scores == []


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_the_other_families_heads_equal_transformers(family, tmp_path):
    path = build_tiny_head(tmp_path / family, family)
    ref = TransformersReference(str(path))
    with _engine(path) as engine:
        assert engine.model_family == family and engine.class_labels == SENTIMENT
        for _ in range(2):  # cold, then the query from the cache
            result = engine.score(QUERY, ITEMS)
            assert max_abs_diff(result.scores, ref.class_scores(QUERY, ITEMS)) < TOLERANCE
        assert result.cached_tokens == 3 * len(QUERY)


def test_a_reward_model_answers_its_score(tmp_path):
    """One label (a reward model's score, Skywork-Reward's shape): the logit per item with
    apply_softmax=False; a softmax over one score (always 1.0) refused."""
    path = build_tiny_head(tmp_path / "reward", "llama", labels=("reward",))
    ref = TransformersReference(str(path))
    with _engine(path) as engine:
        assert engine.class_labels == ("reward",)
        got = engine.score(QUERY, ITEMS, apply_softmax=False).scores
        assert max_abs_diff(got, ref.class_scores(QUERY, ITEMS, apply_softmax=False)) < TOLERANCE
        with pytest.raises(InvalidRequestError, match="one output"):
            engine.score(QUERY, ITEMS)


@pytest.fixture(scope="module")
def head_server(tmp_path_factory):
    """`prefillonly serve` on the tiny Llama head (no --app, no --classify)."""
    from server_process import running_server

    path = build_tiny_head(tmp_path_factory.mktemp("head-serve"), "llama")
    log = tmp_path_factory.mktemp("head-serve-log") / "serve.log"
    with running_server(path, log) as server:
        yield server, TransformersReference(str(path))


def test_v1_score_without_labels_answers_the_classes(head_server):
    """SGLang's /v1/score on a head model (no label_token_ids): each item's class
    probabilities, the query from the cache the second time (usage's cached_tokens)."""
    server, ref = head_server
    body = {"query": QUERY, "items": ITEMS, "apply_softmax": True}
    for _ in range(2):
        answer = requests.post(f"{server.url}/v1/score", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        got = answer.json()
        assert max_abs_diff(got["scores"], ref.class_scores(QUERY, ITEMS)) < TOLERANCE
    assert got["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * len(QUERY)


def test_v1_classify_answers_with_the_heads_classes(head_server):
    """vLLM's /v1/classify on a head model with no --classify: per input the head's class
    probabilities (the whole input the prompt), the label the most probable of id2label's;
    use_activation false: the logits."""
    server, ref = head_server
    texts = ["the medicine worked", "terrible side effects"]
    answer = requests.post(f"{server.url}/v1/classify", json={"input": texts}, timeout=60)
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["labels"] == list(SENTIMENT)
    want = ref.class_scores("", texts)
    assert max_abs_diff([d["probs"] for d in data["data"]], want) < TOLERANCE
    for d, row in zip(data["data"], want, strict=True):
        assert d["label"] == SENTIMENT[max(range(3), key=row.__getitem__)]
        assert d["num_classes"] == 3
    raw = requests.post(
        f"{server.url}/v1/classify", json={"input": texts, "use_activation": False}, timeout=60
    ).json()
    want = ref.class_scores("", texts, apply_softmax=False)
    assert max_abs_diff([d["probs"] for d in raw["data"]], want) < TOLERANCE


def test_dsl_functions_run_on_the_head(llama):
    """A @classifier declared with the head's classes (in its own order) runs on the head:
    no labels sent, each probability the head's for that class; a batch sharing a prefix is
    one request behind it; a @ranker sorts by a class's probability; labels that are not
    the head's classes, and normalize=False, are refused naming the problem."""
    engine, ref, _ = llama
    prefix = "Review of a medicine. "

    @prefillonly.classifier(labels=["positive", "negative", "neutral"])
    def sentiment(review: str) -> Prompt:
        return Prompt(prefix=prefix, item=review)

    reviews = ["it worked", "awful", "fine I guess"]
    results = sentiment.batch(reviews, engine=engine, progress=False)
    want = ref.class_scores(prefix, reviews)
    for result, row in zip(results, want, strict=True):
        got = [result.probs[label] for label in SENTIMENT]
        assert max_abs_diff([got], [row]) < TOLERANCE
        assert result.label == SENTIMENT[max(range(3), key=row.__getitem__)]

    @prefillonly.ranker(labels=list(SENTIMENT), score="positive")
    def best(context: str, item: str) -> Prompt:
        return Prompt(prefix=context, item=item)

    ranking = best(prefix, items=reviews, engine=engine)
    order = sorted(range(3), key=lambda i: -want[i][2])
    assert [r.item for r in ranking.items] == [reviews[i] for i in order]

    @prefillonly.classifier(labels=["good", "bad"])
    def other(review: str) -> str:
        return review

    with pytest.raises(InvalidRequestError, match="are not the model's classes"):
        other("it worked", engine=engine)

    @prefillonly.classifier(labels=list(SENTIMENT), normalize=False)
    def raw(review: str) -> str:
        return review

    with pytest.raises(InvalidRequestError, match="normalize=True"):
        raw("it worked", engine=engine)


def test_verify_checks_a_head_by_its_class_scores(tmp_path):
    """`prefillonly verify` on a head checkpoint compares its class logits (cold, long,
    cached) with transformers' and marks the token probes as not applying."""
    from prefillonly_sgl.verification.verify import verify

    path = build_tiny_head(tmp_path / "verify", "qwen3")
    report = verify(path, quick=True, variants=["all features"], progress=lambda line: None)
    assert report.head and report.ok, report.table()
    (result,) = report.results
    assert {n for n, c in result.checks.items() if c.applies} == {"cold", "long", "cached"}
    assert result.max_diff < TOLERANCE
    assert "n/a" in report.table()


def test_a_head_classifier_through_remote_backend(head_server):
    """RemoteBackend reads the server's head classes from /server_info and sends the
    function's prompts without labels: the same probabilities as the head's."""
    from prefillonly_sgl.dsl import RemoteBackend

    server, ref = head_server

    @prefillonly.classifier(labels=["neutral", "positive", "negative"])
    def sentiment(review: str) -> Prompt:
        return Prompt(prefix="Review: ", item=review)

    backend = RemoteBackend(server.url)
    assert backend.class_labels == SENTIMENT
    reviews = ["it worked", "awful"]
    results = sentiment.batch(reviews, engine=backend, progress=False)
    want = ref.class_scores("Review: ", reviews)
    got = [[r.probs[label] for label in SENTIMENT] for r in results]
    assert max_abs_diff(got, want) < TOLERANCE
