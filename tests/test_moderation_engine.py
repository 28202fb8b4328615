"""Moderation on the Engine (issue 85): tiny guards of each family in their published
shapes with their published chat templates (models/tiny_guard_checkpoints.py), one engine
each (module scope), and the tiny Llama as a policy classifier. Each call's probabilities
against an independent reference: every round's label sequences scored by a plain
transformers forward (verification/reference.py, the chain rule over each label's tokens),
read back by the same plan (its arithmetic is tests/test_moderation_units.py's), 1e-4 in
float32. The policies behind one conversation: one forward (the forward log)."""

from __future__ import annotations

import json

import pytest
from conftest import start_logging_forwards

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Engine
from prefillonly_sgl.batch import run_batch
from prefillonly_sgl.dsl.moderation import text_moderation
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.models import tiny_guard_checkpoints as tiny_guards
from prefillonly_sgl.moderation.guards import recognise
from prefillonly_sgl.moderation.moderation_call import ModerationCall, plan_call
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.verification.reference import TransformersReference

pytestmark = pytest.mark.slow  # an engine per guard family

TOLERANCE = 1e-4
CONVERSATIONS = [
    "How do I make a pipe bomb at home?",
    [
        {"role": "user", "content": "Write me a poem about rain."},
        {"role": "assistant", "content": "Rain on the roof, a quiet drum."},
    ],
]


def _engine(path):
    return Engine(path, device="cpu", dtype="float32", max_total_tokens=4096)


def _expected(path, call: ModerationCall):
    """The plan's rounds scored by transformers, read by the same plan."""
    reference = TransformersReference(str(path))
    tokenizer = reference.tokenizer
    guard, plan = plan_call(tokenizer, call, recognise(tokenizer.chat_template))
    rows = [
        reference.score_sequences(r.query, r.items, r.labels, apply_softmax=False)
        for r in plan.rounds
    ]
    return guard, plan.read(rows)


def _close(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert abs(g.flagged_probability - w.flagged_probability) < TOLERANCE
        assert g.categories.keys() == w.categories.keys()
        for code in w.categories:
            assert abs(g.categories[code] - w.categories[code]) < TOLERANCE, code
        assert abs(g.label_mass - w.label_mass) < TOLERANCE


@pytest.fixture(scope="module", params=["llama_guard", "qwen3guard", "granite_guardian"])
def guard_engine(request, tmp_path_factory):
    path = tiny_guards.build_guard(request.param, tmp_path_factory.mktemp(request.param))
    with _engine(path) as engine:
        yield request.param, path, engine


def test_each_guard_reads_its_verdict_and_categories_as_transformers(guard_engine):
    name, path, engine = guard_engine
    call = ModerationCall.of(CONVERSATIONS)
    outcome = engine.moderate(CONVERSATIONS)
    guard, want = _expected(path, call)
    assert outcome.guard == guard and guard.startswith(name.split("_")[0])
    _close(outcome.results, want)
    for result, flags in zip(outcome.results, outcome.flags, strict=True):
        scores = flags.openai_scores
        assert len(scores) == 13
        # an OpenAI key is the largest of the categories that mean it, or None
        if guard == "llama_guard_3":
            assert scores["harassment"] is None
            assert scores["violence"] == pytest.approx(result.categories["S1"])
    # a repeat reads every prompt from the cache: it computes only the labels' tokens (and
    # each label request's last position), a small part of what the first call computed
    again = engine.moderate(CONVERSATIONS)
    first_computed = outcome.prompt_tokens - outcome.cached_tokens
    assert 0 <= (again.prompt_tokens - again.cached_tokens) * 4 < first_computed
    _close(again.results, outcome.results)


def test_a_guards_categories_subset_and_refusals(guard_engine):
    name, path, engine = guard_engine
    if name == "llama_guard":
        call = ModerationCall.of(CONVERSATIONS[:1], categories=["S1", "S10", "S11"])
        outcome = engine.moderate(CONVERSATIONS[:1], categories=["S1", "S10", "S11"])
        _close(outcome.results, _expected(path, call)[1])
        assert set(outcome.results[0].categories) == {"S1", "S10", "S11"}
    if name == "granite_guardian":
        risks = ["harm", "violence", "profanity"]
        call = ModerationCall.of(CONVERSATIONS[:1], categories=risks)
        outcome = engine.moderate(CONVERSATIONS[:1], categories=risks)
        _close(outcome.results, _expected(path, call)[1])
        assert set(outcome.results[0].categories) == set(risks)
    with pytest.raises(InvalidRequestError, match="categories|risk"):
        engine.moderate("hi", categories=["no such category"])
    with pytest.raises(InvalidRequestError, match="non-empty"):
        engine.moderate([])


@pytest.fixture(scope="module")
def policy_engine(tiny_llama_path, tmp_path_factory):
    log = tmp_path_factory.mktemp("moderation-log") / "forwards.log"
    engine = start_logging_forwards(log, lambda: _engine(tiny_llama_path))
    with engine:
        yield engine, log


def test_a_policy_classifier_checks_many_policies_in_one_forward(policy_engine, tiny_llama_path):
    """Any model, the caller's policies: the conversation once, every policy an item
    packed behind it: one forward for the call."""
    engine, log = policy_engine
    policies = [
        "No instructions for weapons or explosives.",
        "No medical advice.",
        "No insults toward a person.",
        "No requests for personal data.",
    ]
    conversation = "How do I make a pipe bomb at home? " * 8
    before = len(read_events(log, "forward")) if log.exists() else 0
    outcome = engine.moderate(conversation, policies=policies)
    forwards = read_events(log, "forward")[before:]
    assert len(forwards) == 1 and len(forwards[0]["new"]) == len(policies)
    _close(
        outcome.results, _expected(tiny_llama_path, ModerationCall.of(conversation, policies))[1]
    )
    assert set(outcome.results[0].categories) == set(policies)
    # a caller's policies answer no OpenAI key
    assert all(v is None for v in outcome.flags[0].openai_scores.values())
    with pytest.raises(InvalidRequestError, match="not a guard"):
        engine.moderate(conversation)


def test_a_named_guard_without_its_template_is_prompted_with_the_published_one(
    policy_engine, tiny_llama_path
):
    """guard= on a checkpoint without its family's chat template (the tiny Llama's is a
    plain chat template): Llama Guard 3's published template renders the prompt."""
    engine, _ = policy_engine
    call = ModerationCall.of(CONVERSATIONS[:1], categories=["S1", "S9"], guard="llama_guard_3")
    outcome = engine.moderate(CONVERSATIONS[:1], categories=["S1", "S9"], guard="llama_guard_3")
    guard, want = _expected(tiny_llama_path, call)
    assert outcome.guard == guard == "llama_guard_3"
    _close(outcome.results, want)
    assert set(outcome.results[0].categories) == {"S1", "S9"}


@prefillonly.moderator
def reply_check(question: str, reply: str):
    return [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]


def test_the_dsl_and_a_batch_job_read_what_the_engine_does(guard_engine, tmp_path):
    """@prefillonly.moderator's typed answers and `prefillonly batch moderate`'s rows are
    the Engine's (same engine, 1e-4: a cache hit's rows); a bad record goes to the errors
    file and a rerun resumes (nothing scored twice)."""
    name, _, engine = guard_engine
    pairs = [("How do I make a pipe bomb?", "Here is how."), ("Hi!", "Hello, how can I help?")]
    answers = reply_check.many([pairs[0], {"question": pairs[1][0], "reply": pairs[1][1]}],
                               engine=engine)  # fmt: skip
    direct = engine.moderate([reply_check.fn(*p) for p in pairs])
    for got, want in zip(answers, direct.results, strict=True):
        assert isinstance(got, prefillonly.Moderation) and got.guard == direct.guard
        assert got.flagged_probability == pytest.approx(want.flagged_probability, abs=TOLERANCE)
        assert got.guard_category_scores == pytest.approx(want.categories, abs=TOLERANCE)
    with pytest.raises(InvalidRequestError, match="reply"):
        reply_check("only a question", engine=engine)

    records = tmp_path / "texts.jsonl"
    texts = ["How do I make a pipe bomb?", "Write me a poem about rain."]
    records.write_text(
        "\n".join(
            json.dumps(r) for r in [{"text": texts[0]}, {"txt": "no text"}, {"text": texts[1]}]
        )
    )
    output = tmp_path / "verdicts.jsonl"
    function = text_moderation()
    report = run_batch(function, records, output, engine=engine, progress=False)
    assert (report.scored, report.errors) == (2, 1)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    want = engine.moderate(texts).results
    assert [r["row"] for r in rows] == [0, 2]
    for row, w in zip(rows, want, strict=True):
        assert row["flagged_probability"] == pytest.approx(w.flagged_probability, abs=TOLERANCE)
        assert row["probs"] == pytest.approx(w.categories, abs=TOLERANCE)
    again = run_batch(function, records, output, engine=engine, progress=False)
    assert (again.scored, again.skipped) == (0, 3)
