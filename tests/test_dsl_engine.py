"""The scoring DSL on a real Engine (tiny random Llama, float32): classifier and ranker
results equal a direct Engine.score of the compiled request, the prefix/item split is what
reaches SGLang, batch order is kept, label and input errors come before anything is sent,
and the async variants work on the engine's event loop."""

from __future__ import annotations

import asyncio
import enum
import math

import pytest
from conftest import max_abs_diff

import prefillonly_sgl as prefillonly
from prefillonly_sgl import InvalidRequestError, LabelError, Prompt
from prefillonly_sgl.dsl import DeclarationError, LocalEngineBackend

# The DSL against the Engine on the same requests: equal but for float32 order of sums (a
# prefix from the cache vs computed with the batch: ~1e-6 seen), well under the 1e-4 to
# transformers that the engine tests hold.
TOLERANCE = 1e-5

PROFILE = "User profile: likes science fiction, history books and long walks."
FILMS = ["a documentary about the moon landing", "socks", "history of walks", "a space opera"]
FEW_SHOT = (
    "Review: this medicine worked well\nSentiment: positive\n\n"
    "Review: terrible side effects\nSentiment: negative\n\n"
)
REVIEWS = ["I feel much better now", "would not take it again", "ok", "it worked, no side effects"]


class Sentiment(enum.Enum):
    POSITIVE = "positive"
    NEGATIVE = "negative"
    NEUTRAL = "neutral"


@prefillonly.classifier(labels=Sentiment)
def sentiment(review: str) -> Prompt:
    return Prompt(prefix=FEW_SHOT, item=f"Review: {review}\nSentiment:")


@prefillonly.classifier(labels=["Yes", "No"], chat=True, system="Answer Yes or No.")
def chat_relevant(profile: str, item: str) -> Prompt:
    return Prompt(prefix=f"{profile}\n", item=f"Item: {item}\nRelevant?")


@prefillonly.ranker(labels=["Yes", "No"], score="Yes")
def recommend(profile: str, item: str) -> Prompt:
    return Prompt(prefix=f"{profile}\n", item=f"Item: {item}\nRelevant? Answer Yes or No:")


class RecordingBackend(LocalEngineBackend):
    """The real local backend, keeping each request it sends to SGLang."""

    def __init__(self, engine):
        super().__init__(engine)
        self.sent = []

    async def score(self, request):
        self.sent.append(request)
        return await super().score(request)


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine  # conftest: one per session


def direct(engine, request) -> list[list[float]]:
    """What Engine.score gives for a compiled request."""
    return engine.score(
        request.query, list(request.items), list(request.label_token_ids), apply_softmax=True
    ).scores


def test_classifier_equals_engine_score(engine):
    result = sentiment("I feel much better now", engine=engine)
    (request,) = sentiment.compile(engine.tokenizer, "I feel much better now").requests
    (want,) = direct(engine, request)
    got = [result.probs[s.value] for s in Sentiment]
    assert max_abs_diff([got], [want]) < TOLERANCE
    assert isinstance(result.label, Sentiment)
    assert result.label == list(Sentiment)[max(range(3), key=want.__getitem__)]
    tok = engine.tokenizer
    assert list(request.label_token_ids) == [
        tok.encode(" " + s.value, add_special_tokens=False)[0] for s in Sentiment
    ]


def test_a_classifier_with_a_temperature_equals_engine_score_with_it(engine):
    """@classifier(temperature=T): the request carries T and the probabilities are
    Engine.score's with temperature=T; a temperature that is not a finite number > 0, or
    one without normalize, is refused at declaration."""

    @prefillonly.classifier(labels=Sentiment, temperature=3.0)
    def soft(review: str) -> Prompt:
        return Prompt(prefix=FEW_SHOT, item=f"Review: {review}\nSentiment:")

    (request,) = soft.compile(engine.tokenizer, "ok").requests
    assert request.temperature == 3.0
    got = [soft("ok", engine=engine).probs[s.value] for s in Sentiment]
    want = engine.score(
        request.query, list(request.items), list(request.label_token_ids), temperature=3.0
    ).scores
    assert max_abs_diff([got], want) < TOLERANCE
    cold = [sentiment("ok", engine=engine).probs[s.value] for s in Sentiment]
    assert max(got) < max(cold)  # a temperature above 1 flattens the distribution
    for bad in (0, -1.0, float("inf"), True):
        with pytest.raises(DeclarationError, match="temperature must be a finite number"):
            prefillonly.classifier(labels=["a", "b"], temperature=bad)(lambda x: x)
    with pytest.raises(DeclarationError, match="temperature needs normalize=True"):
        prefillonly.classifier(labels=["a", "b"], temperature=2.0, normalize=False)(lambda x: x)


def test_prefix_and_items_reach_sglang_as_query_and_items(engine):
    backend = RecordingBackend(engine)
    results = sentiment.batch(REVIEWS, engine=backend, progress=False)
    # One shared prefix: one request (the scheduler computes the prefix once).
    assert [len(r.items) for r in backend.sent] == [len(REVIEWS)]
    assert all(r.query == FEW_SHOT for r in backend.sent)
    items = [f"Review: {r}\nSentiment:" for r in REVIEWS]
    assert [item for r in backend.sent for item in r.items] == items
    labels = list(backend.sent[0].label_token_ids)
    want = engine.score(FEW_SHOT, items, labels).scores  # everything in one request
    got = [[r.probs[s.value] for s in Sentiment] for r in results]
    assert max_abs_diff(got, want) < TOLERANCE
    # The split never changes a probability: the whole prompt as one item gives the same.
    whole = engine.score("", [FEW_SHOT + item for item in items], labels)
    assert max_abs_diff(got, whole.scores) < TOLERANCE


def test_batch_keeps_input_order_across_prefixes_and_chunks(engine):
    profiles = [PROFILE, "User profile: likes cooking.", PROFILE, "User profile: likes cooking."]
    inputs = [(p, f) for p, f in zip(profiles, FILMS)] + [(PROFILE, "tea")]
    backend = RecordingBackend(engine)
    results = chat_relevant.batch(inputs, engine=backend, batch_size=2, progress=False)
    # Grouped by profile, in chunks of at most 2.
    assert [(r.query[-9:], len(r.items)) for r in backend.sent] == [
        ("g walks.\n", 2),
        ("g walks.\n", 1),
        ("cooking.\n", 2),
    ]
    singles = [chat_relevant(*x, engine=engine) for x in inputs]
    got = [[r.probs["Yes"], r.probs["No"]] for r in results]
    assert max_abs_diff(got, [[r.probs["Yes"], r.probs["No"]] for r in singles]) < TOLERANCE
    assert max_abs_diff([got[0]], [got[2]]) > 1e-4  # different inputs: visibly different rows


def test_chat_classifier_equals_engine_score_on_the_rendered_prompt(engine):
    result = chat_relevant(PROFILE, FILMS[0], engine=engine)
    (request,) = chat_relevant.compile(engine.tokenizer, PROFILE, FILMS[0]).requests
    assert request.query.startswith("<|im_start|>system\nAnswer Yes or No.<|im_end|>\n")
    assert request.items[0].endswith("<|im_start|>assistant\n")
    tok = engine.tokenizer
    assert list(request.label_token_ids) == [
        tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No")
    ]
    want = direct(engine, request)
    assert max_abs_diff([[result.probs["Yes"], result.probs["No"]]], want) < TOLERANCE


def test_ranker_equals_engine_score_and_sorts(engine):
    backend = RecordingBackend(engine)
    ranking = recommend(PROFILE, items=FILMS, top_k=3, engine=backend)
    assert [(r.query, len(r.items)) for r in backend.sent] == [(PROFILE + "\n", 4)]
    sent = backend.sent[0]
    want = engine.score(
        sent.query, [i for r in backend.sent for i in r.items], list(sent.label_token_ids)
    ).scores
    got = [[r.probs["Yes"], r.probs["No"]] for r in ranking.by_input]
    assert max_abs_diff(got, want) < TOLERANCE
    order = sorted(range(len(FILMS)), key=lambda i: -want[i][0])[:3]
    assert [r.index for r in ranking.items] == order
    assert [r.item for r in ranking.items] == [FILMS[i] for i in order]
    assert all(r.score == r.probs["Yes"] for r in ranking.items)


def test_default_backend(engine):
    with prefillonly.use(engine):
        assert sentiment("ok").probs == sentiment("ok", engine=engine).probs


def test_label_and_input_errors_before_sending(engine):
    @prefillonly.classifier(labels=["positive", "wonderful"])
    def bad_labels(review: str) -> str:
        return f"Review: {review}\nSentiment: "  # a trailing space merges with the labels

    backend = RecordingBackend(engine)
    with pytest.raises(LabelError, match="label 'positive' merges with the prompt's last"):
        bad_labels("fine", engine=backend)
    with pytest.raises(InvalidRequestError, match="review: Input should be a valid string"):
        sentiment(42, engine=backend)
    with pytest.raises(InvalidRequestError, match=r"inputs\[1\]"):
        sentiment.batch(["fine", None], engine=backend, progress=False)
    assert backend.sent == []
    assert sentiment("fine", engine=engine).label in Sentiment  # the engine is fine


def test_async_variants_on_the_engines_loop(engine):
    run = engine.run_until_complete  # on the engine's own loop
    one = run(sentiment.acall("ok", engine=engine))
    many = run(sentiment.abatch(REVIEWS, engine=engine, batch_size=1, progress=False))
    ranking = run(recommend.acall(PROFILE, items=FILMS, engine=engine))
    assert max_abs_diff([list(one.probs.values())], [list(many[2].probs.values())]) < TOLERANCE
    sync = sentiment.batch(REVIEWS, engine=engine, progress=False)
    got = [list(r.probs.values()) for r in many]
    assert max_abs_diff(got, [list(r.probs.values()) for r in sync]) < TOLERANCE
    sync_ranking = recommend(PROFILE, items=FILMS, engine=engine)
    assert [r.index for r in ranking.items] == [r.index for r in sync_ranking.items]


def test_async_on_another_loop_is_an_error_not_a_hang(engine):
    async def call():
        return await asyncio.wait_for(sentiment.acall("ok", engine=engine), timeout=30)

    with pytest.raises(RuntimeError, match="another asyncio event loop"):
        asyncio.run(call())


def test_a_setwise_ranker_lists_every_item_in_one_prompt(engine, tiny_llama_reference):
    """@ranker(setwise=TOKEN): one request whose one item lists every candidate, each
    followed by the dedicated token; each candidate's probabilities are the labels' after
    its token (SGLang's setwise readout), within 1e-4 of transformers on the whole prompt;
    a prompt holding the token itself is refused before anything is sent."""
    anchor = engine.tokenizer.eos_token

    @prefillonly.ranker(labels=["Yes", "No"], score="Yes", setwise=anchor)
    def shortlist(profile: str, item: str) -> Prompt:
        return Prompt(prefix=f"{profile}\nCandidates:\n", item=f"- {item}, fits?")

    backend = RecordingBackend(engine)
    ranking = shortlist(PROFILE, items=FILMS, top_k=2, engine=backend)
    (sent,) = backend.sent
    assert sent.items == ("".join(f"- {film}, fits?{anchor}" for film in FILMS),)
    assert sent.score_extraction_token == anchor
    ref = tiny_llama_reference
    rows = ref.anchor_logprobs(
        ref.tokenizer.encode(sent.query + sent.items[0]),
        ref.tokenizer.convert_tokens_to_ids(anchor),
        sent.label_token_ids,
    )
    want = []
    for row in rows:  # the labels' probabilities normalised over the labels
        total = sum(math.exp(x) for x in row)
        want.append([math.exp(x) / total for x in row])
    got = [[r.probs["Yes"], r.probs["No"]] for r in ranking.by_input]
    assert len(got) == len(FILMS) and max_abs_diff(got, want) < 1e-4
    assert [r.item for r in ranking.items] == [
        FILMS[i] for i in sorted(range(len(FILMS)), key=lambda i: -want[i][0])[:2]
    ]
    with pytest.raises(InvalidRequestError, match="setwise token"):
        shortlist(PROFILE, items=[f"socks{anchor}"], engine=engine)
    with pytest.raises(DeclarationError, match="setwise="):
        prefillonly.ranker(labels=["Yes"], setwise=anchor, chat=True)(lambda item: item)
