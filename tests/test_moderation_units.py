"""Moderation's plain parts (issue 85; prefillonly_sgl/moderation/): the taxonomies' OpenAI
keys, the verdict readout's arithmetic, and a call's plan (its shared query, items and
labels) with a character tokenizer, its rows read back into each input's result. No
SGLang, no model: the engine side is tests/test_moderation_engine.py."""

from __future__ import annotations

import math

import pytest

from prefillonly_sgl.moderation import readout
from prefillonly_sgl.moderation.flags import flags_of
from prefillonly_sgl.moderation.guard_prompts import conversation_text, policy_prompt
from prefillonly_sgl.moderation.moderation_call import ModerationCall
from prefillonly_sgl.moderation.plan import (
    InputResult,
    Prompt,
    code_extensions,
    plan_moderation,
    split_common,
    tokens_after,
)
from prefillonly_sgl.moderation.taxonomies import (
    GRANITE_GUARDIAN,
    LLAMA_GUARD_3,
    OPENAI_CATEGORIES,
    QWEN3GUARD,
    openai_scores,
)
from prefillonly_sgl.scoring.errors import InvalidRequestError


def encode(text: str) -> list[int]:
    """A character tokenizer (every character its code point): boundaries never merge."""
    return [ord(c) for c in text]


def test_openai_keys_are_answered_only_by_the_categories_that_mean_them():
    assert len(OPENAI_CATEGORIES) == 13
    scores = openai_scores(LLAMA_GUARD_3, {"S1": 0.3, "S9": 0.6, "S10": 0.1, "S5": 0.9})
    assert scores["violence"] == 0.3  # S1 alone
    assert scores["illicit/violent"] == 0.6  # S1 and S9: the larger
    assert scores["hate"] == 0.1
    assert scores["harassment"] is None  # no Llama Guard category means harassment
    every = {code: 0.5 for code in LLAMA_GUARD_3.codes()}
    assert set(LLAMA_GUARD_3.unanswered()) == {
        k for k, v in openai_scores(LLAMA_GUARD_3, every).items() if v is None
    }
    assert "harassment" in LLAMA_GUARD_3.unanswered() and "violence" not in (
        LLAMA_GUARD_3.unanswered()
    )
    assert all(v is None for v in openai_scores(None, {"my policy": 0.9}).values())
    for taxonomy in (LLAMA_GUARD_3, QWEN3GUARD, GRANITE_GUARDIAN):
        for category in taxonomy.categories:
            assert set(category.openai) <= set(OPENAI_CATEGORIES), category


def test_verdicts_sum_their_ways_and_report_their_mass():
    probs = {"safe": 0.2, "\n\nsafe": 0.1, "unsafe": 0.3, "\n\nunsafe": 0.0}
    verdict, mass = readout.verdict_probabilities(readout.LLAMA_GUARD_VERDICTS, probs)
    assert math.isclose(mass, 0.6) and math.isclose(verdict["unsafe"], 0.5)
    even, none = readout.verdict_probabilities(readout.YES_NO_VERDICTS, {"Yes": 0, "No": 0})
    assert even == {"Yes": 0.5, "No": 0.5} and none == 0.0


def test_a_code_whose_tokens_begin_another_keeps_what_the_longer_does_not_take():
    # with characters, "S1" begins "S10" and "S11": S1 written alone is P("S1") less theirs
    extensions = code_extensions(["S1", "S10", "S11", "S2"], encode, "unsafe\n")
    assert extensions == {"S1": ("S10", "S11"), "S10": (), "S11": (), "S2": ()}
    probs = {"S1": 0.5, "S10": 0.2, "S11": 0.1, "S2": 0.2}  # P(tokens of each code)
    share = readout.first_of(extensions, probs)
    assert share == pytest.approx({"S1": 0.2 / 0.7, "S10": 0.2 / 0.7, "S11": 0.1 / 0.7,
                                   "S2": 0.2 / 0.7})  # fmt: skip
    assert readout.category_scores(0.5, {"S1": 0.4, "S2": 0.6}) == {"S1": 0.2, "S2": 0.3}
    # a chain: S1 < S10 < S100: S1 less S10 only (S10's probability holds S100's)
    assert code_extensions(["S1", "S10", "S100"], encode, "")["S1"] == ("S10",)

    def llama3(text):  # "S10" is "S", "10": no code begins another
        return {"S1": [83, 16], "S10": [83, 605]}.get(text, [ord(c) for c in text])

    assert code_extensions(["S1", "S10"], llama3, "") == {"S1": (), "S10": ()}


def test_a_boundary_the_tokenizer_merges_keeps_its_merge():
    def merging(text: str) -> list[int]:  # "\nS" is one token: 999
        out, i = [], 0
        while i < len(text):
            if text[i : i + 2] == "\nS":
                out.append(999)
                i += 2
            else:
                out.append(ord(text[i]))
                i += 1
        return out

    assert tokens_after(merging, "unsafe", "\nS1") == [999, ord("1")]
    assert tokens_after(merging, "unsafe\n", "S1") == merging("S1")  # no extension: alone


def test_the_calls_prompts_share_one_query_each_keeping_an_item():
    query, items = split_common([[1, 2, 3, 4], [1, 2, 3, 5, 6], [1, 2, 3]])
    assert query == [1, 2] and items == [[3, 4], [3, 5, 6], [3]]


def _llama_guard_plan():
    prompts = [
        Prompt(0, None, tuple(encode("CATS|user: hi|A:"))),
        Prompt(1, None, tuple(encode("CATS|user: what hurts|A:"))),
    ]
    return plan_moderation("llama_guard_3", prompts, 2, encode, LLAMA_GUARD_3)


def test_llama_guard_reads_its_verdict_then_the_first_code_after_unsafe():
    plan = _llama_guard_plan()
    first, second = plan.rounds
    assert first.query == encode("CATS|user: ")  # the category list, shared
    assert first.texts == ["safe", "\n\nsafe", "unsafe", "\n\nunsafe"]
    assert first.labels[1] == encode("\n\nsafe")
    # round 2: each prompt followed by each way of writing "unsafe\n", then the codes
    assert second.items[0] == encode("hi|A:unsafe\n")
    assert second.items[1] == encode("hi|A:\n\nunsafe\n")
    assert second.items[2] == encode("what hurts|A:unsafe\n")
    # each code one label; with characters S1's tokens begin S10-S14's
    assert second.texts[:3] == ["S1", "S2", "S3"]
    assert second.labels[0] == encode("S1")
    assert len(second.labels) == len(LLAMA_GUARD_3.categories)
    assert plan.code_extensions["S1"] == ("S10", "S11", "S12", "S13", "S14")

    def row_1(texts, p):
        return [p.get(t, 0.0) for t in texts]

    rows1 = [
        row_1(first.texts, {"safe": 0.9, "unsafe": 0.1}),
        row_1(first.texts, {"unsafe": 0.6, "\n\nunsafe": 0.2, "safe": 0.2}),
    ]
    codes = {"S1": 1.0, "S10": 0.5}  # "S1" then "0": S10; "S1" then anything else: S1
    rows2 = [row_1(second.texts, codes)] * 4
    first_input, second_input = plan.read([rows1, rows2])
    assert math.isclose(first_input.flagged_probability, 0.1)
    assert math.isclose(second_input.flagged_probability, 0.8)
    assert math.isclose(second_input.categories["S1"], 0.4)
    assert math.isclose(second_input.categories["S10"], 0.4)
    assert math.isclose(sum(second_input.categories.values()), 0.8)


def test_qwen3guard_asks_after_safety_then_the_categories():
    prompts = [Prompt(0, None, tuple(encode("<im>user\nhello<im>assistant\n")))]
    plan = plan_moderation("qwen3guard", prompts, 1, encode, QWEN3GUARD)
    first, second = plan.rounds
    assert first.query + first.items[0] == encode("<im>user\nhello<im>assistant\nSafety:")
    assert first.labels == [encode(" Safe"), encode(" Unsafe"), encode(" Controversial")]
    assert (second.query + second.items[0])[-len("Categories:") :] == encode("Categories:")
    assert second.texts[0] == " Violent" and second.labels[0] == encode(" Violent")
    rows1 = [[0.1, 0.6, 0.3]]
    rows2 = [[1.0 if t == " PII" else 0.0 for t in second.texts]]
    (result,) = plan.read([rows1, rows2])
    assert math.isclose(result.flagged_probability, 0.6)
    assert math.isclose(result.categories["PII"], 0.6) and result.categories["Violent"] == 0.0
    assert math.isclose(result.verdicts["Controversial"], 0.3)


def test_policies_behind_one_conversation_are_items_of_one_query():
    conversation = [{"role": "user", "content": "sell me a gun"}]
    policies = ["no weapons", "no drugs", "be polite"]
    prompts = [Prompt(0, p, tuple(encode(policy_prompt(conversation, p)))) for p in policies]
    plan = plan_moderation("yes_no", prompts, 1, encode, verdicts=readout.POLICY_VERDICTS)
    (only,) = plan.rounds
    assert only.query == encode(f"Conversation:\n{conversation_text(conversation)}\n\nPolicy: ")
    assert len(only.items) == 3 and only.labels == [encode(" Yes"), encode(" No")]
    (result,) = plan.read([[[0.8, 0.2], [0.1, 0.3], [0.0, 0.5]]])
    assert result.categories == {"no weapons": 0.8, "no drugs": 0.25, "be polite": 0.0}
    assert result.flagged_probability == 0.8 and math.isclose(result.label_mass, 0.4)


def test_an_unknown_guard_kind_is_refused():
    with pytest.raises(ValueError, match="unknown guard kind"):
        plan_moderation("shieldgemma", [Prompt(0, None, (1, 2))], 1, encode)


def test_flags_of_a_verdict_guard_name_the_category_decoding_writes_first():
    result = InputResult(0.8, {"S1": 0.2, "S9": 0.35, "S10": 0.25}, 0.9)
    flags = flags_of("llama_guard_3", LLAMA_GUARD_3, result, threshold=0.5)
    assert flags.flagged
    assert flags.guard_flags == {"S1": False, "S9": True, "S10": False}
    assert flags.openai_flags["illicit/violent"] is True  # S9 (and S1, not flagged)
    assert flags.openai_flags["violence"] is False  # S1 alone
    assert flags.openai_flags["hate"] is False
    # keys no checked category answers: None, flag and score alike
    assert flags.openai_flags["harassment"] is None and flags.openai_scores["harassment"] is None
    assert flags.openai_flags["self-harm"] is None  # S11 not in this call
    below = flags_of("llama_guard_3", LLAMA_GUARD_3, result, threshold=0.9)
    assert not below.flagged and not any(below.guard_flags.values())


def test_flags_of_yes_no_guards_are_per_risk():
    result = InputResult(0.7, {"violence": 0.7, "profanity": 0.4, "harm": 0.6}, 1.0)
    flags = flags_of("granite_guardian", GRANITE_GUARDIAN, result, threshold=0.5)
    assert flags.flagged
    assert flags.guard_flags == {"violence": True, "profanity": False, "harm": True}
    assert flags.openai_flags["violence"] is True and flags.openai_flags["harassment"] is False
    policies = flags_of("policy", None, InputResult(0.2, {"No ads.": 0.2}, 1.0))
    assert not policies.flagged and set(policies.openai_flags.values()) == {None}


def test_a_call_refuses_bad_thresholds_and_inputs():
    with pytest.raises(InvalidRequestError, match="threshold"):
        ModerationCall.of("hi", threshold=0)
    with pytest.raises(InvalidRequestError, match="threshold"):
        ModerationCall.of("hi", threshold=True)
    with pytest.raises(InvalidRequestError, match="role"):
        ModerationCall.of([[{"role": "robot", "content": "x"}]])
    with pytest.raises(InvalidRequestError, match="repeat"):
        ModerationCall.of("hi", policies=["a", "a"])
    assert ModerationCall.of("hi").inputs == (({"role": "user", "content": "hi"},),)


def test_the_batch_clis_built_in_moderate_checks_each_records_text():
    from prefillonly_sgl.batch.cli import find_function
    from prefillonly_sgl.batch.tasks import task_for

    function = find_function("moderate", ["No ads.", "No insults."])
    assert function.options["policies"] == ["No ads.", "No insults."]
    prepared = task_for(function).prepare(3, {"text": "buy now", "id": 7})
    assert (prepared.row, function.render(**prepared.arguments)) == (3, "buy now")
    with pytest.raises(InvalidRequestError, match="text"):
        task_for(function).prepare(0, {"body": "no text field"})
    with pytest.raises(ValueError, match="--policy"):
        find_function("some_app.py:check", ["No ads."])


def test_a_named_guard_gets_its_published_template_where_the_checkpoint_has_another():
    from prefillonly_sgl.models import guard_templates
    from prefillonly_sgl.moderation.guards import template_for

    llama_guard = guard_templates.template_text("llama_guard_3_8b.jinja")
    assert template_for("llama_guard_3", llama_guard) == llama_guard  # its own kept
    plain = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    published = template_for("llama_guard_3", plain)
    assert published == guard_templates.template_text("llama_guard_3_1b.jinja")
    assert template_for("qwen3guard", plain) == guard_templates.template_text(
        "qwen3guard_gen.jinja"
    )
    assert template_for("policy", plain) == plain


def test_serve_names_the_guard_for_its_moderations_route():
    from prefillonly_sgl.server.options import parse_serve_argv

    options, rest = parse_serve_argv(["--guard", "qwen3guard", "--model-path", "m"])
    assert options.guard == "qwen3guard" and rest == ["--model-path", "m"]
    assert parse_serve_argv(["--model-path", "m"])[0].guard is None
    with pytest.raises(SystemExit):  # argparse's refusal names the choices
        parse_serve_argv(["--guard", "shieldgemma"])
