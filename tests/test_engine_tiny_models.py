"""Engine.score on tiny random-weight Llama and Qwen2 models: parity with a transformers
forward (float32, 1e-4; long batches in hybrid prefilling's query chunks), bad requests
rejected with clear errors, engine still usable."""

from __future__ import annotations

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import Engine, InvalidRequestError
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4  # float32 engine vs float32 transformers; observed differences ~1e-7

QUERY = "User profile: likes science fiction, history books and long walks.\n"
ITEMS = [  # different lengths in one call
    "Item: a documentary about the history of the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction and walks, " * 20 + "Relevant?",
]


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_engine(request, tiny_llama_path, tiny_qwen2_path):
    # 64-token chunks: a call's batch (and the long item) runs its decoder layers in query
    # chunks (hybrid prefilling, mode "layer"), so both families' layer forwards are checked
    # against transformers here. The Qwen2 engine is the session's (the same settings).
    if request.param == "qwen2":
        yield tiny_qwen2_path, request.getfixturevalue("tiny_qwen2_engine")
        return
    with Engine(
        tiny_llama_path,
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        hybrid_prefill_chunk_size=64,
    ) as engine:
        yield tiny_llama_path, engine


@pytest.fixture(scope="module")
def labels(model_and_engine):
    _, engine = model_and_engine
    tok = engine.tokenizer
    return [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No", " good")]


def test_text_prompts_match_transformers(model_and_engine, labels):
    path, engine = model_and_engine
    got = engine.score(QUERY, ITEMS, labels).scores
    want = TransformersReference(path).score(QUERY, ITEMS, labels)
    assert len(got) == len(ITEMS) and all(len(row) == len(labels) for row in got)
    assert max_abs_diff(got, want) < TOLERANCE
    assert all(abs(sum(row) - 1.0) < 1e-6 for row in got)
    # Random weights still give clearly different rows: a mixed-up item order would fail.
    assert max_abs_diff([got[0]], [got[1]]) > 1e-3


def test_token_id_prompts_and_vocabulary_probs_match(model_and_engine, labels):
    path, engine = model_and_engine
    ref = TransformersReference(path)
    query_ids = ref.tokenizer.encode(QUERY)
    item_ids = [ref.tokenizer.encode(item, add_special_tokens=False) for item in ITEMS]
    got = engine.score(query_ids, item_ids, labels, apply_softmax=False).scores
    want = ref.score(query_ids, item_ids, labels, apply_softmax=False)
    assert max_abs_diff(got, want) < TOLERANCE
    assert all(sum(row) < 1 - 1e-3 for row in got)  # a share of the whole vocabulary


def test_repeated_prefix_gives_same_answer(model_and_engine, labels):
    """The second call hits SGLang's prefix cache; the result must not change."""
    _, engine = model_and_engine
    first = engine.score(QUERY, ITEMS[:1], labels).scores
    again = engine.score(QUERY, ITEMS[:1], labels).scores
    assert max_abs_diff(first, again) < TOLERANCE


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(items="not a list of items but a str is fine", label_token_ids=[]), "is empty"),
        (dict(label_token_ids="Yes"), "must be a list"),
        (dict(label_token_ids=[10**6]), "out of vocabulary"),
        (dict(label_token_ids=[-1]), "out of vocabulary"),
        (dict(label_token_ids=[5, 7, 5]), "duplicates: [5]"),
        (dict(label_token_ids=[5.0]), "must be integers"),
        (dict(query="", items=[""]), "prompt (query + item) is empty"),
        (dict(query=[], items=[[1, 2, 10**6]]), "items[0] has token ids outside"),
        (dict(query="x", items=[[1, 2]]), "both be text or both be token ids"),
        (dict(items=[None]), "items[0] must be a string"),
        (dict(query="word " * 5000), "longer than the"),
    ],
)
def test_bad_requests_raise_clear_errors(model_and_engine, labels, change, message):
    _, engine = model_and_engine
    request = dict(query=QUERY, items=ITEMS[:1], label_token_ids=labels)
    request.update(change)
    with pytest.raises(InvalidRequestError) as error:
        engine.score(**request)
    assert message in str(error.value)


def test_engine_still_scores_after_bad_requests(model_and_engine, labels):
    path, engine = model_and_engine
    bad_labels = dict(label_token_ids=[10**6])
    for bad in (bad_labels, dict(query="", items=[""]), dict(query="word " * 5000)):
        with pytest.raises(InvalidRequestError):
            engine.score(**{"query": QUERY, "items": ITEMS[:1], "label_token_ids": labels, **bad})
    got = engine.score(QUERY, ITEMS[1:2], labels).scores
    want = TransformersReference(path).score(QUERY, ITEMS[1:2], labels)
    assert max_abs_diff(got, want) < TOLERANCE


def test_result_reads_as_sglangs_list_of_rows(model_and_engine, labels):
    """Code written against SGLang's Engine.score (a list of per-item rows) keeps working."""
    _, engine = model_and_engine
    result = engine.score(QUERY, ITEMS, labels)
    assert len(result) == len(ITEMS) and result[1] == result.scores[1]
    assert list(result) == result.scores and result == result.scores
    assert [len(row) for row in result] == [len(labels)] * len(ITEMS)


def _straddling_query(count, limit: int, item: str) -> str:
    """A query whose prompt is within `limit` tokens as query + item but not as item +
    query: " the" is one token of the tiny tokenizer, "the " is not."""
    per_unit = count("a " * 100) / 100
    start = int(limit / per_unit) - 40
    for n in range(start, start + 80):
        query = "a " * n + " "
        if count(query + item) <= limit < count(item + query):
            return query
    raise AssertionError("no query straddles the limit: the tiny tokenizer changed?")


def test_item_first_prompts_are_counted_in_sglangs_order(model_and_engine, labels):
    """SGLang scores item + query with item_first: the limit applies to that text's tokens
    (BPE merges differently across the join), in the Engine as in the server."""
    _, engine = model_and_engine
    count = lambda text: len(engine.tokenizer.encode(text))  # noqa: E731
    limit = engine.limits.scoring_prompt_tokens
    query = _straddling_query(count, limit, "the")
    assert len(engine.score(query, ["the"], labels).scores) == 1  # query + item fits
    with pytest.raises(InvalidRequestError, match=f"is {limit + 1} tokens, longer than the"):
        engine.score(query, ["the"], labels, item_first=True)


# -- labels of several tokens (docs/labels.md) -------------------------------------------


@pytest.fixture(scope="module")
def sequences(labels):
    """Labels of 1-4 tokens: three share their first token, one is another's prefix."""
    yes, no, good = labels
    return [[yes], [yes, no], [yes, good, no], [no, good, yes, good], [good]]


def test_multi_token_labels_match_transformers(model_and_engine, sequences):
    path, engine = model_and_engine
    ref = TransformersReference(path)
    got = engine.score(QUERY, ITEMS, sequences).scores
    want = ref.score_sequences(QUERY, ITEMS, sequences)
    assert max_abs_diff(got, want) < TOLERANCE
    assert all(abs(sum(row) - 1.0) < 1e-6 for row in got)
    assert max_abs_diff([got[0]], [got[1]]) > 1e-3  # rows differ: items not mixed up
    raw = engine.score(QUERY, ITEMS, sequences, apply_softmax=False).scores
    assert max_abs_diff(raw, ref.score_sequences(QUERY, ITEMS, sequences, False)) < TOLERANCE
    # a longer label is a product of more factors: P(yes no) < P(yes)
    assert all(row[1] < row[0] for row in raw)


def test_length_normalised_and_token_id_prompts_match(model_and_engine, sequences):
    path, engine = model_and_engine
    ref = TransformersReference(path)
    query_ids = ref.tokenizer.encode(QUERY)
    item_ids = [ref.tokenizer.encode(item, add_special_tokens=False) for item in ITEMS]
    for apply_softmax in (True, False):
        got = engine.score(
            query_ids, item_ids, sequences, apply_softmax, length_normalize=True
        ).scores
        want = ref.score_sequences(query_ids, item_ids, sequences, apply_softmax, True)
        assert max_abs_diff(got, want) < TOLERANCE


def test_multi_token_labels_after_a_chat_prompt_and_item_first(model_and_engine, sequences):
    path, engine = model_and_engine
    ref = TransformersReference(path)
    chat = ref.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is this relevant? " + ITEMS[0]}],
        tokenize=False,
        add_generation_prompt=True,
    )
    got = engine.score(chat, [""], sequences).scores
    assert max_abs_diff(got, ref.score_sequences(chat, [""], sequences)) < TOLERANCE
    got = engine.score(QUERY, ITEMS[:2], sequences, item_first=True).scores
    want = ref.score_sequences(QUERY, ITEMS[:2], sequences, item_first=True)
    assert max_abs_diff(got, want) < TOLERANCE


def test_label_prefixes_are_cache_hits_of_their_prompt(model_and_engine, sequences, labels):
    """Each continuation (prompt + label prefix) finds the whole prompt cached: the
    prompt is computed once per item, the labels' tokens are the only new work."""
    _, engine = model_and_engine
    items = [f"Fresh item {i}: {ITEMS[0]}" for i in range(2)]
    prompts = [len(engine.tokenizer.encode(QUERY + item)) for item in items]
    node_lengths = [1, 2, 1, 2, 3]  # yes; yes good; no; no good; no good yes
    result = engine.score(QUERY, items, sequences)
    continuation_tokens = sum(p + n for p in prompts for n in node_lengths)
    assert result.prompt_tokens == sum(prompts) + continuation_tokens
    assert result.cached_tokens >= len(node_lengths) * sum(prompts)
    # one-token labels: one forward per prompt, as before
    single = engine.score(QUERY, items, labels)
    assert single.prompt_tokens == sum(prompts)


@pytest.mark.parametrize(
    "labels_given, message",
    [
        ([[5, 6], [5, 6]], "duplicates: [[5, 6]]"),
        ([[5, 6], []], "a non-empty list of them), got []"),
        ([[5, 10**6]], "Token ID 1000000 is out of vocabulary"),
        ([[5, "6"]], "must be integers"),
    ],
)
def test_bad_multi_token_labels_raise_clear_errors(model_and_engine, labels_given, message):
    _, engine = model_and_engine
    with pytest.raises(InvalidRequestError) as error:
        engine.score(QUERY, ITEMS[:1], labels_given)
    assert message in str(error.value)


def test_an_engines_settings_line_holds_no_key(tiny_llama_path, capfd):
    """SGLang logs every setting at start (log level info), keys included; ours are
    redacted by field, a two-letter key too (sglang_runtime/redacted_settings.py)."""
    from prefillonly_sgl import Engine

    capfd.readouterr()
    with Engine(
        tiny_llama_path, device="cpu", dtype="float32", max_total_tokens=1024,
        api_key="zq", admin_api_key="admin-key-for-the-log-test", log_level="info",
    ) as engine:  # fmt: skip
        assert engine.score("Hello", [" a"], [1, 2]).scores
    logged = capfd.readouterr()
    text = logged.out + logged.err
    assert "server_args=" in text and "'api_key': '<redacted>'" in text
    assert "'zq'" not in text and "admin-key-for-the-log-test" not in text
