"""The scoring DSL without SGLang: label sets and their token compilation, declaration and
input errors, the prefix/item split of compiled requests, chat templates, ranking order.
Uses the tiny test tokenizer (" good", "good", " Yes", ... are single tokens)."""

from __future__ import annotations

import asyncio
import enum
from typing import Literal

import pytest
from pydantic import BaseModel

import prefillonly_sgl as prefillonly
from prefillonly_sgl.dsl import (
    DeclarationError,
    LabelError,
    Prompt,
    ScoreRequest,
    compile_labels,
    label_set,
)
from prefillonly_sgl.models.tiny import build_tokenizer
from prefillonly_sgl.scoring.errors import InvalidRequestError


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def one_token(tok, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


class Sentiment(enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"


# -- label sets --------------------------------------------------------------------------
def test_label_sets_from_list_enum_and_literal():
    assert label_set(["good", "bad"]).texts == ("good", "bad")
    enum_set = label_set(Sentiment)
    assert enum_set.texts == ("positive", "negative")
    assert enum_set.values == (Sentiment.POSITIVE, Sentiment.NEGATIVE)
    assert label_set(Literal["A", "B", "C"]).texts == ("A", "B", "C")
    assert label_set([1, 2, 3]).texts == ("1", "2", "3")


@pytest.mark.parametrize(
    "labels, message",
    [
        ([], "the label set is empty"),
        (["good", "good"], "repeated: ['good']"),
        (["good", " "], "label ' ' is blank"),
        ([1.5], "must be a string or an integer"),
        ("good", "must be a list"),
    ],
)
def test_bad_label_sets_fail_at_declaration(labels, message):
    with pytest.raises(LabelError, match=message.replace("[", r"\[").replace("]", r"\]")):

        @prefillonly.classifier(labels=labels)
        def f(x: str) -> str:
            return x


def test_labels_from_return_annotation():
    @prefillonly.classifier
    def by_literal(x: str) -> Literal["Yes", "No"]:
        return x

    @prefillonly.classifier()
    def by_enum(x: str) -> Sentiment:
        return x

    assert by_literal.labels.texts == ("Yes", "No")
    assert by_enum.labels.values == (Sentiment.POSITIVE, Sentiment.NEGATIVE)
    with pytest.raises(DeclarationError, match="no labels"):

        @prefillonly.classifier
        def no_labels(x: str) -> str:
            return x


# -- compilation to token ids ------------------------------------------------------------
def test_leading_space_follows_the_prompt_end(tok):
    labels = label_set(["good", "bad"])
    assert compile_labels(labels, tok, "Credit risk:") == [
        one_token(tok, " good"),
        one_token(tok, " bad"),
    ]
    assert compile_labels(labels, tok, "Credit risk:\n") == [
        one_token(tok, "good"),
        one_token(tok, "bad"),
    ]
    assert compile_labels(labels, tok, "Credit risk:", leading_space=False) == [
        one_token(tok, "good"),
        one_token(tok, "bad"),
    ]
    # A label written with its own leading space is taken verbatim.
    assert compile_labels(label_set([" good"]), tok, "x\n") == [one_token(tok, " good")]


def test_labels_of_several_tokens_compile_to_their_tokens_in_context(tok):
    ids = compile_labels(label_set(["good", "excellent"]), tok, "Credit risk:")
    assert ids == [
        one_token(tok, " good"),
        tuple(tok.encode(" excellent", add_special_tokens=False)),
    ]
    assert len(ids[1]) == 7
    # after whitespace, no space is added: "excellent" as its own tokens
    assert compile_labels(label_set(["excellent"]), tok, "Risk:\n") == [
        tuple(tok.encode("excellent", add_special_tokens=False))
    ]


def test_labels_of_several_tokens_must_differ(tok):
    with pytest.raises(LabelError, match="labels ' excellent' and 'excellent' collide"):
        compile_labels(label_set([" excellent", "excellent"]), tok, "Answer:")


def test_colliding_labels_error(tok):
    # " good" (verbatim) and "good" (after a prompt without trailing whitespace: " good").
    with pytest.raises(LabelError, match="labels ' good' and 'good' collide.*' good'"):
        compile_labels(label_set([" good", "good"]), tok, "Answer:")


def test_label_merging_with_a_trailing_space_is_an_error(tok):
    with pytest.raises(LabelError, match="merges with the prompt's last characters"):
        compile_labels(label_set(["good"]), tok, "Answer: ")


def test_label_error_at_first_use(tok):
    @prefillonly.classifier(labels=["good", "wonderful"])
    def review(text: str) -> str:
        return f"Review: {text}\nSentiment: "  # the trailing space merges with " good"

    with pytest.raises(LabelError, match="'good' merges with the prompt's last characters"):
        review.compile(tok, "fine")


# -- inputs ------------------------------------------------------------------------------
class Applicant(BaseModel):
    name: str
    loans: int


@prefillonly.classifier(labels=["good", "bad"])
def credit_risk(applicant: Applicant, note: str = "") -> str:
    return f"Applicant {applicant.name}, {applicant.loans} loans. {note}\nCredit risk:"


def test_inputs_are_validated_from_the_signature(tok):
    call = credit_risk.compile(tok, {"name": "Ann", "loans": "2"})  # dict -> model, "2" -> 2
    assert call.requests[0].items == ("Applicant Ann, 2 loans. \nCredit risk:",)
    with pytest.raises(InvalidRequestError, match=r"applicant.loans: .*valid integer"):
        credit_risk.compile(tok, {"name": "Ann", "loans": "many"})
    with pytest.raises(InvalidRequestError, match="note: Input should be a valid string"):
        credit_risk.compile(tok, Applicant(name="A", loans=1), note=3)
    with pytest.raises(InvalidRequestError, match="missing a required argument"):
        credit_risk.compile(tok)
    with pytest.raises(InvalidRequestError, match=r"inputs\[1\]: .*loans"):
        credit_risk.compile_batch(tok, [({"name": "a", "loans": 1},), ({"name": "b"},)])


def test_declaration_errors():
    with pytest.raises(DeclarationError, match="'engine' is reserved"):

        @prefillonly.classifier(labels=["Yes", "No"])
        def f(engine: str) -> str:
            return engine

    with pytest.raises(DeclarationError, match=r"\*args"):

        @prefillonly.classifier(labels=["Yes", "No"])
        def g(*texts: str) -> str:
            return ""

    with pytest.raises(DeclarationError, match="'top_k' is reserved"):

        @prefillonly.ranker(labels=["Yes", "No"])
        def h(top_k: int, item: str) -> str:
            return item


def test_no_backend_is_a_clear_error():
    with pytest.raises(InvalidRequestError, match="no backend"):
        credit_risk(Applicant(name="a", loans=1))


def test_use_sets_and_restores_the_default(tok):
    with prefillonly.use("http://127.0.0.1:1") as backend:
        assert prefillonly.dsl.backends.default_backend() is backend
        assert repr(backend) == "RemoteBackend('http://127.0.0.1:1')"
    assert prefillonly.dsl.backends.default_backend() is None
    with pytest.raises(InvalidRequestError, match="http:// or https://"):
        prefillonly.use("localhost:1")


# -- prefix / item split -----------------------------------------------------------------
FEW_SHOT = "Review: works great\nSentiment: positive\n\nReview: awful\nSentiment: negative\n\n"


@prefillonly.classifier(labels=Sentiment)
def sentiment(review: str) -> Prompt:
    return Prompt(prefix=FEW_SHOT, item=f"Review: {review}\nSentiment:")


def test_shared_prefix_becomes_the_query_of_one_request(tok):
    call = sentiment.compile_batch(tok, ["good", "bad", "fine"])
    items = tuple(f"Review: {r}\nSentiment:" for r in ("good", "bad", "fine"))
    labels = (one_token(tok, " positive"), one_token(tok, " negative"))
    assert call.requests == (ScoreRequest(FEW_SHOT, items, labels),)
    assert call.where == ((0, 0), (0, 1), (0, 2))


def test_batches_group_by_prefix_and_chunk_in_input_order(tok):
    @prefillonly.classifier(labels=["Yes", "No"])
    def relevant(profile: str, item: str) -> Prompt:
        return Prompt(prefix=f"Profile: {profile}\n", item=f"Item: {item}\nRelevant?")

    inputs = [("a", "1"), ("b", "2"), ("a", "3"), {"profile": "a", "item": "4"}, ("a", "6")]
    inputs += [("b", "5")]
    call = relevant.compile_batch(tok, inputs, batch_size=2)
    assert [(r.query, r.items) for r in call.requests] == [
        ("Profile: a\n", ("Item: 1\nRelevant?", "Item: 3\nRelevant?")),
        ("Profile: a\n", ("Item: 4\nRelevant?", "Item: 6\nRelevant?")),
        ("Profile: b\n", ("Item: 2\nRelevant?", "Item: 5\nRelevant?")),
    ]
    answers = [[[0.1, 0.9], [0.3, 0.7]], [[0.4, 0.6], [0.6, 0.4]], [[0.2, 0.8], [0.5, 0.5]]]
    assert [row[0] for row in call.gather(answers)] == [0.1, 0.2, 0.3, 0.4, 0.6, 0.5]


def test_prefixes_of_a_single_input_are_batched_whole(tok):
    @prefillonly.classifier(labels=["Yes", "No"])
    def relevant(profile: str, item: str) -> Prompt:
        return Prompt(prefix=f"Profile: {profile}\n", item=f"Item: {item}\nRelevant?")

    call = relevant.compile_batch(tok, [("a", "1"), ("b", "2"), ("c", "3"), ("b", "4")])
    assert [(r.query, r.items) for r in call.requests] == [
        ("", ("Profile: a\nItem: 1\nRelevant?", "Profile: c\nItem: 3\nRelevant?")),
        ("Profile: b\n", ("Item: 2\nRelevant?", "Item: 4\nRelevant?")),
    ]
    assert call.where == ((0, 0), (1, 0), (0, 1), (1, 1))


def test_plain_string_prompt_is_all_item(tok):
    call = credit_risk.compile(tok, Applicant(name="a", loans=0))
    assert call.requests[0].query == ""


def test_empty_prompt_is_refused(tok):
    @prefillonly.classifier(labels=["Yes", "No"])
    def empty(x: str) -> str:
        return x

    with pytest.raises(InvalidRequestError, match="the prompt is empty"):
        empty.compile(tok, "")


# -- chat templates ----------------------------------------------------------------------
def test_chat_template_split_and_labels_without_space(tok):
    @prefillonly.classifier(labels=["Yes", "No"], chat=True, system="Answer Yes or No.")
    def relevant(profile: str, item: str) -> Prompt:
        return Prompt(prefix=f"Profile: {profile}\n", item=f"Item: {item}\nRelevant?")

    request = relevant.compile(tok, "likes books", "a novel").requests[0]
    assert request.query == (
        "<|im_start|>system\nAnswer Yes or No.<|im_end|>\n<|im_start|>user\nProfile: likes books\n"
    )
    assert request.items == ("Item: a novel\nRelevant?<|im_end|>\n<|im_start|>assistant\n",)
    messages = [
        {"role": "system", "content": "Answer Yes or No."},
        {"role": "user", "content": "Profile: likes books\nItem: a novel\nRelevant?"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert request.query + request.items[0] == rendered
    # The assistant turn opens with a newline: labels without a leading space.
    assert request.label_token_ids == (one_token(tok, "Yes"), one_token(tok, "No"))


def test_chat_template_that_rewrites_the_message_is_refused():
    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] | trim }}{% endfor %}\n"

    @prefillonly.classifier(labels=["Yes", "No"], chat=True)
    def f(x: str) -> Prompt:
        return Prompt(prefix="Q ", item=x + " ")

    with pytest.raises(InvalidRequestError, match="changes the user message"):
        f.compile(tok, "x")
    tok.chat_template = None
    with pytest.raises(InvalidRequestError, match="no chat template"):
        f.compile(tok, "x")


# -- rankers -----------------------------------------------------------------------------
@prefillonly.ranker(labels=["Yes", "No"], score="Yes")
def recommend(profile: str, item: str) -> Prompt:
    return Prompt(prefix=f"Profile: {profile}\n", item=f"Item: {item}\nRelevant?")


def test_ranker_compiles_to_one_request(tok):
    items = ("Item: moon\nRelevant?", "Item: socks\nRelevant?", "Item: war\nRelevant?")
    labels = (one_token(tok, " Yes"), one_token(tok, " No"))
    call = recommend.compile(tok, "likes history", items=["moon", "socks", "war"])
    assert call.requests == (ScoreRequest("Profile: likes history\n", items, labels),)
    with pytest.raises(InvalidRequestError, match="items is empty"):
        recommend.compile(tok, "x", items=[])
    with pytest.raises(InvalidRequestError, match=r"items: .*valid string"):
        recommend.compile(tok, "x", items=["a", 3])


class TableBackend:
    """A stand-in backend for ranking-order tests: answers rows from a table by item."""

    def __init__(self, tokenizer, rows: dict[str, list[float]]):
        self.tokenizer = tokenizer
        self.rows = rows
        self.requests: list[ScoreRequest] = []

    async def ascore(self, request):
        self.requests.append(request)
        return [self.rows[item] for item in request.items]


def test_ranking_is_sorted_stable_and_top_k(tok):
    rows = {
        "Item: a\nRelevant?": [0.2, 0.8],
        "Item: b\nRelevant?": [0.9, 0.1],
        "Item: c\nRelevant?": [0.2, 0.8],
        "Item: d\nRelevant?": [0.6, 0.4],
    }
    backend = TableBackend(tok, rows)
    ranking = recommend("p", items=["a", "b", "c", "d"], engine=backend)
    assert [r.item for r in ranking.items] == ["b", "d", "a", "c"]  # a before c: a tie
    assert [r.index for r in ranking.items] == [1, 3, 0, 2]
    assert [r.item for r in ranking.by_input] == ["a", "b", "c", "d"]
    assert ranking.by_input[1].probs == {"Yes": 0.9, "No": 0.1}
    top = recommend("p", items=["a", "b", "c", "d"], top_k=2, engine=backend)
    assert [r.item for r in top.items] == ["b", "d"] and len(top.by_input) == 4
    assert [len(r.items) for r in backend.requests] == [4, 4]  # one request a call
    with pytest.raises(InvalidRequestError, match="top_k"):
        recommend("p", items=["a"], top_k=0, engine=backend)


def test_a_synchronous_call_inside_a_running_loop_runs_on_a_loop_of_its_own(tok):
    """A notebook cell is synchronous code on a running loop: Backend.wait cannot re-enter
    it, so the job runs on its own loop in a worker thread (same answer as outside)."""
    rows = {"Item: a\nRelevant?": [0.2, 0.8], "Item: b\nRelevant?": [0.9, 0.1]}
    outside = recommend("p", items=["a", "b"], engine=TableBackend(tok, rows))

    async def cell():
        return recommend("p", items=["a", "b"], engine=TableBackend(tok, rows))

    inside = asyncio.run(cell())
    assert [r.item for r in inside.items] == [r.item for r in outside.items] == ["b", "a"]


def test_a_servers_backend_refuses_synchronous_use():
    from prefillonly_sgl.dsl.backends.server import server_backend

    context = type("Context", (), {})()
    backend = server_backend(context)
    assert server_backend(context) is backend  # one per serving runtime: its priors live on

    async def job():
        return []

    with pytest.raises(RuntimeError, match="await backend.run"):
        backend.wait(job())


def test_ranker_expected_rating_and_item_parameter(tok):
    @prefillonly.ranker(labels=["1", "2", "3"], score={"1": 1, "2": 2, "3": 3}, item="film")
    def rate(film: str, user: str) -> Prompt:
        return Prompt(prefix=f"User: {user}\n", item=f"Film: {film}\nRating:\n")

    assert rate.item_param == "film"
    rows = {"Film: x\nRating:\n": [0.5, 0.0, 0.5], "Film: y\nRating:\n": [0.0, 0.0, 1.0]}
    ranking = rate("me", items=["x", "y"], engine=TableBackend(tok, rows))
    assert [(r.item, r.score) for r in ranking.items] == [("y", 3.0), ("x", 2.0)]
    # score= per call: a label, or a function of the probabilities.
    by_one = rate("me", items=["x", "y"], score="1", engine=TableBackend(tok, rows))
    assert [(r.item, r.score) for r in by_one.items] == [("x", 0.5), ("y", 0.0)]
    by_fn = rate("me", items=["x", "y"], score=lambda p: -p["3"], engine=TableBackend(tok, rows))
    assert [r.item for r in by_fn.items] == ["x", "y"]
    with pytest.raises(LabelError, match="'4' is not one of the labels"):
        rate("me", items=["x"], score="4", engine=TableBackend(tok, rows))


def test_results_are_typed_by_the_labels(tok):
    backend = TableBackend(tok, {"Review: ok\nSentiment:": [0.25, 0.75]})
    result = sentiment("ok", engine=backend)
    assert result.label is Sentiment.NEGATIVE
    assert result.probs == {"positive": 0.25, "negative": 0.75}
    assert result.prob == 0.75
    assert abs(result.logprobs["positive"] - (-1.3862943611198906)) < 1e-12
    assert sentiment.result_model.model_fields["label"].annotation is Sentiment
