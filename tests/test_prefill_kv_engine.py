"""Prefill-only KV inside a running engine (tiny random Llama, float32).

Our engine has a KV pool of only POOL tokens. Label probabilities equal stock SGLang's
(same pool) and a transformers forward (1e-4) with no shared prefix, a shared prefix
(first and repeated: cache hit), items of different lengths, token ids, and a batch mixing
requests, a cold query and its items in one forward (followers packed behind their
leader); a prompt ~3x longer than the pool scores correctly (stock refuses it); SGLang's
cached-token count shows the query prefix is a cache hit and the rest of a prompt never
enters the cache. SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY makes the scheduler check
after every batch that the pool's slots add up (a leak or a double free kills it).
"""

from __future__ import annotations

import asyncio
import math
import os
import random

import pytest
from conftest import max_abs_diff

from prefillonly_sgl import STOCK_SGLANG, Engine
from prefillonly_sgl.features.prefill_kv.messages import REUSABLE_LEN_KEY
from prefillonly_sgl.features.prefill_kv.policy import common_prefix_len, reusable_prefix_len
from prefillonly_sgl.hooking.events import read_events
from prefillonly_sgl.machine.environment import ATTENTION_LOG as LOG_ENV
from prefillonly_sgl.machine.environment import FORWARD_LOG
from prefillonly_sgl.scoring.errors import InvalidRequestError
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4
# Prompts of 2k-4k tokens, several times the pool: between runs of the whole suite on the
# 2-core Xeon (avx512_bf16) these differed from the reference by up to 3.7e-4 (alone:
# 1e-7). float32 reduction order over that many tokens varies (thread split of the CPU
# kernels; not pinned down yet, see the session note): the long-prompt checks use this.
LONG_PROMPT_TOLERANCE = 1e-3
POOL = 1024  # KV pool tokens of both engines

PROFILE = "User profile: likes science fiction, history books and long walks. " * 6 + "\n"
ITEMS = [
    "Item: a documentary about the moon landing. Relevant? Answer Yes or No:",
    "Item: socks. Relevant?",
    "Item: " + "a long book about the history of science fiction and walks, " * 8 + "Relevant?",
]
OTHER_ITEMS = ["Item: a telescope. Relevant?", "Item: " + "history, " * 40 + "Relevant?"]
LONG_ITEM = "Item: " + "a long book about the history of science fiction and walks, " * 130


def _start(path, **kwargs):
    return Engine(path, device="cpu", dtype="float32", max_total_tokens=POOL, **kwargs)


# (query, items, score kwargs) that are compared with stock SGLang.
STOCK_CALLS = [
    ("", ITEMS, {}),
    ("Q", ITEMS, {"item_first": True}),
    ("Another profile: enjoys gardening and old maps. " * 5 + "\n", ITEMS, {}),
    ("Another profile: enjoys gardening and old maps. " * 5 + "\n", OTHER_ITEMS, {}),
    (PROFILE, ITEMS, {"apply_softmax": False}),
    (PROFILE, OTHER_ITEMS, {}),
]
THIRD_QUERY = "Third profile: collects stamps and vinyl records. " * 4 + "\n"


def _key(query, items, kwargs):
    return repr((query, items, sorted(kwargs.items())))


@pytest.fixture(scope="module")
def setup(tiny_llama_path, tmp_path_factory):
    """Stock SGLang runs first and is shut down before ours starts: SGLang's
    Engine.shutdown() kills every child process of this process, other engines' too."""
    ref = TransformersReference(tiny_llama_path)
    labels = [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]
    stock = {}
    with _start(tiny_llama_path, **STOCK_SGLANG) as engine:
        stock["patches"] = engine.features
        stock["max_prompt_tokens"] = engine.limits.scoring_prompt_tokens
        for query, items, kwargs in STOCK_CALLS:
            stock[_key(query, items, kwargs)] = engine.score(query, items, labels, **kwargs).scores
        prompt = ref.prompt_ids(THIRD_QUERY, ITEMS[0])
        stock["cached"] = [_cached_tokens(engine, prompt, 5) for _ in range(2)]
        stock["fields"] = _sglang_fields_calls(engine, ref, labels)
        longest = engine.limits.scoring_prompt_tokens  # the longest prompt stock accepts
        stock["longest_scores"] = engine.score([7] * 16, [[9] * (longest - 16)], labels).scores
    log_path = tmp_path_factory.mktemp("kv-log") / "plan.log"
    saved = dict(os.environ)
    os.environ[LOG_ENV] = str(log_path)
    os.environ[FORWARD_LOG] = str(log_path)
    # The scheduler checks after every batch that the pool's slots add up (a leak or a
    # double free kills it).
    os.environ["SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY"] = "1"
    try:
        ours = _start(tiny_llama_path)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    yield ours, stock, ref, labels, log_path
    ours.shutdown()


def _check(setup, query, items, **kwargs):
    ours, stock, ref, labels, _ = setup
    got = ours.score(query, items, labels, **kwargs).scores
    want = ref.score(query, items, labels, **kwargs)
    assert max_abs_diff(got, want) < TOLERANCE
    key = _key(query, items, kwargs)
    if key in stock:
        assert max_abs_diff(got, stock[key]) < TOLERANCE
    return got


PLACEHOLDER = 5  # the embedding overrides' placeholder token (a test's choice)


def _override_case(ref):
    """(query ids, item ids, query overrides, item overrides): the placeholder once in the
    query and once in each item but the last, each replaced by a seeded random vector."""
    rng = random.Random(76)
    hidden = ref.model.config.hidden_size

    def vector():
        return [rng.uniform(-0.05, 0.05) for _ in range(hidden)]

    query = [rng.randrange(10, 300) for _ in range(40)] + [PLACEHOLDER, 11, 12]
    items = [[21, PLACEHOLDER, 22, 23], [31, 32, PLACEHOLDER], [41, 42, 43]]
    return query, items, [vector()], [[vector()], [vector()], None]


def _sglang_fields_calls(engine, ref, labels):
    """What the score fields SGLang passes through answer on ``engine``: temperature,
    return_token_logprobs, the embedding overrides (the same calls for both engines)."""
    query, items, q_over, i_over = _override_case(ref)
    warm = engine.score(PROFILE, ITEMS, labels, temperature=0.5)
    cold = engine.score("Other: " + PROFILE, ITEMS, labels, return_token_logprobs=True)
    overridden = engine.score(
        query,
        items,
        labels,
        embed_override_token_id=PLACEHOLDER,
        query_embed_overrides=q_over,
        item_embed_overrides=i_over,
    )
    return {
        "temperature": warm.scores,
        "token_logprobs": cold.token_logprobs,
        "logprob_scores": cold.scores,
        "overrides": overridden.scores,
    }


def test_sglang_score_fields_through_engine_score(setup):
    """SGLang 0.5.23's other score fields through Engine.score (issue 75, item 3), each
    against transformers (1e-4) and stock: temperature (the softmax over the labels of
    their log-probabilities over it; the profile a cache hit), return_token_logprobs
    (each label's full-vocabulary log-probability), the embedding overrides (the query's
    and each item's placeholder replaced; an item may have none); labels of several
    tokens take temperature and return their sequence log-probabilities; each field that
    cannot be served is refused by name before anything is sent."""
    ours, stock, ref, labels, _ = setup
    got = _sglang_fields_calls(ours, ref, labels)
    for key, value in got.items():
        assert max_abs_diff(value, stock["fields"][key]) < TOLERANCE, key

    def label_logprobs(query, item):
        return ref.next_token_logprobs(ref.prompt_ids(query, item))[labels].tolist()

    def softmax(row, t):
        top = max(row)
        weights = [math.exp((x - top) / t) for x in row]
        return [w / sum(weights) for w in weights]

    assert (
        max_abs_diff(got["temperature"], [softmax(label_logprobs(PROFILE, i), 0.5) for i in ITEMS])
        < TOLERANCE
    )
    other = [label_logprobs("Other: " + PROFILE, i) for i in ITEMS]
    assert max_abs_diff(got["token_logprobs"], other) < TOLERANCE
    assert max_abs_diff(got["logprob_scores"], [softmax(r, 1.0) for r in other]) < TOLERANCE
    query, items, q_over, i_over = _override_case(ref)
    want = []
    for item, item_vectors in zip(items, i_over, strict=True):
        ids = query + item
        vectors = q_over + (item_vectors or [])
        positions = [i for i, t in enumerate(ids) if t == PLACEHOLDER][: len(vectors)]
        logprobs = ref.next_token_logprobs(ids, embeds_at=dict(zip(positions, vectors)))
        want.append(softmax(logprobs[labels].tolist(), 1))
    assert max_abs_diff(got["overrides"], want) < TOLERANCE
    plain = [softmax(label_logprobs(query, item), 1) for item in items[:2]]
    assert max_abs_diff(got["overrides"][:2], plain) > 100 * TOLERANCE  # the overrides count

    # labels of several tokens: temperature over their sequence log-probabilities
    two = [[labels[0], labels[1]], [labels[1]]]
    result = ours.score(PROFILE, ITEMS[:2], two, temperature=2.0, return_token_logprobs=True)
    sequences = ref.score_sequences(PROFILE, ITEMS[:2], two, apply_softmax=False)
    logs = [[math.log(p) for p in row] for row in sequences]
    assert max_abs_diff(result.token_logprobs, logs) < TOLERANCE
    assert max_abs_diff(result.scores, [softmax(row, 2.0) for row in logs]) < TOLERANCE

    refusals = [
        ({"temperature": 0}, "temperature must be finite and greater than zero"),
        ({"temperature": float("nan")}, "temperature must be finite"),
        ({"temperature": 2.0, "apply_softmax": False}, "temperature requires apply_softmax"),
        ({"query_embed_overrides": q_over}, "need embed_override_token_id"),
        (
            {"embed_override_token_id": PLACEHOLDER, "item_embed_overrides": [None]},
            "item_embed_overrides has 1 entries for 3 items",
        ),
    ]
    for kwargs, message in refusals:
        with pytest.raises(InvalidRequestError, match=message):
            ours.score(query, items, labels, **kwargs)
    with pytest.raises(InvalidRequestError, match="embedding overrides apply to labels of one"):
        ours.score(query, items, two, embed_override_token_id=PLACEHOLDER)


def _cached_tokens(engine, prompt_ids, reusable):
    """A max_new_tokens=0 request as score sends it, with its reusable length (the
    scheduler reads it from custom_params); returns SGLang's cached-token count."""
    out = engine._sgl.generate(
        input_ids=prompt_ids,
        sampling_params={"max_new_tokens": 0, "custom_params": {REUSABLE_LEN_KEY: reusable}},
    )
    return out["meta_info"]["cached_tokens"]


def test_features_and_limits(setup):
    ours, stock, *_ = setup
    assert ours.features == (
        "prefill_attention",
        "prefill_kv",
        "jct_scheduler",
        "hybrid_prefill",
        "prompt_logprobs",
    )
    assert stock["patches"] == ()
    assert stock["max_prompt_tokens"] < POOL  # stock: bounded by the pool
    assert ours.limits.scoring_prompt_tokens > 3 * POOL  # ours: by the context (4096)
    assert ours.limits.max_prompt_tokens < POOL  # generate prompts keep all their KV
    assert ours.prefill_only_kv_active


def test_no_shared_prefix(setup):
    _check(setup, "", ITEMS)
    _check(setup, "Q", ITEMS, item_first=True)


def test_shared_prefix_first_and_repeated_cache_hit(setup):
    ours, _, ref, _, log_path = setup
    query = "Another profile: enjoys gardening and old maps. " * 5 + "\n"
    first = _check(setup, query, ITEMS)
    assert max_abs_diff(first, _check(setup, query, ITEMS)) < 1e-6
    before = len(read_events(log_path, "prefill_attention.plan"))
    _check(setup, query, OTHER_ITEMS)
    new = read_events(log_path, "prefill_attention.plan")[before:]
    prefixes = [prefix for plan in new for prefix, _ in plan["spans"]]
    reusable = len(ref.tokenizer.encode(query)) - 1  # at least: BPE may merge the last one
    assert prefixes and min(prefixes) >= reusable, new  # the query was not recomputed


def test_token_ids_and_whole_vocabulary(setup):
    _, _, ref, _, _ = setup
    query_ids = ref.tokenizer.encode(PROFILE)
    item_ids = [ref.tokenizer.encode(item, add_special_tokens=False) for item in ITEMS]
    _check(setup, query_ids, item_ids, apply_softmax=False)
    _check(setup, PROFILE, ITEMS, apply_softmax=False)


def test_mixed_batch(setup):
    """Score calls in flight at once: SGLang batches cold and cached requests of
    different lengths, with and without a reusable prefix, into one prefill."""
    ours, _, ref, labels, _ = setup
    _check(setup, PROFILE, ITEMS[:1])  # PROFILE is cached now
    calls = [
        (PROFILE, OTHER_ITEMS, {}),
        ("A never seen query about cooking.\n", ITEMS, {}),
        ("", OTHER_ITEMS, {}),
        (PROFILE[:150], ITEMS[1:], {"item_first": True}),
    ]

    async def all_at_once():
        return await asyncio.gather(
            *(ours.async_score(q, items, labels, **kw) for q, items, kw in calls)
        )

    results = ours._sgl.loop.run_until_complete(all_at_once())
    for (query, items, kw), result in zip(calls, results):
        assert max_abs_diff(result.scores, ref.score(query, items, labels, **kw)) < TOLERANCE


def test_cache_hit_counts_and_suffix_never_cached(setup):
    ours, stock, ref, _, _ = setup
    query = THIRD_QUERY
    query_ids = ref.tokenizer.encode(query)
    prompt = ref.prompt_ids(query, ITEMS[0])
    other = ref.prompt_ids(query, ITEMS[2])
    reusable = reusable_prefix_len(query_ids, prompt)
    assert reusable_prefix_len(query_ids, other) == reusable
    assert _cached_tokens(ours, prompt, reusable) == 0  # cold
    assert _cached_tokens(ours, other, reusable) == reusable  # the query is a hit
    # The same prompt again: still only the query is cached (stock caches all of it).
    assert _cached_tokens(ours, prompt, reusable) == reusable
    assert stock["cached"] == [0, len(prompt) - 1]
    # Through Engine.score: its query prefix is what a later request hits.
    query2 = "Fourth profile: " + "likes chess and jazz. " * 8 + "\n"
    ours.score(query2, ITEMS[:1], setup[3])
    prompt1, prompt2 = (ref.prompt_ids(query2, item) for item in ITEMS[:2])
    kept1 = reusable_prefix_len(ref.tokenizer.encode(query2), prompt1)
    reusable2 = reusable_prefix_len(ref.tokenizer.encode(query2), prompt2)
    assert kept1 > 0
    hit = min(kept1, common_prefix_len(prompt1, prompt2))
    assert _cached_tokens(ours, prompt2, reusable2) == hit


def test_longest_accepted_prompt_scores(setup):
    """Engine.limits.scoring_prompt_tokens is exactly what the scheduler accepts: with the
    feature, the context length minus SGLang's margin, not the pool."""
    ours, stock, ref, labels, _ = setup
    assert len(stock["longest_scores"]) == 1
    longest = ours.limits.scoring_prompt_tokens
    query, item = [7] * 16, [9] * (longest - 16)
    got = ours.score(query, [item], labels).scores
    assert max_abs_diff(got, ref.score(query, [item], labels)) < TOLERANCE
    with pytest.raises(InvalidRequestError):
        ours.score(query, [item + [9]], labels)


def test_suffix_far_longer_than_the_pool(setup):
    ours, stock, ref, labels, _ = setup
    n_tokens = len(ref.prompt_ids(PROFILE, LONG_ITEM))
    assert n_tokens > 3 * POOL
    got = ours.score(PROFILE, [LONG_ITEM], labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, [LONG_ITEM], labels)) < LONG_PROMPT_TOLERANCE
    assert n_tokens > stock["max_prompt_tokens"]  # stock refuses it
    # Two long prompts at once (together 4x the pool) and a short one, in one call.
    half = LONG_ITEM[: len(LONG_ITEM) * 2 // 3]
    items = [half, LONG_ITEM[: len(LONG_ITEM) // 2] + "?", ITEMS[1]]
    got = ours.score(PROFILE, items, labels).scores
    assert max_abs_diff(got, ref.score(PROFILE, items, labels)) < LONG_PROMPT_TOLERANCE
    # The engine is still healthy (the scheduler checked its pool after each batch).
    _check(setup, PROFILE, OTHER_ITEMS)


def test_score_result_reports_cached_tokens(setup):
    """Engine.score reports SGLang's cached-token count: a second call with the same query
    takes the query's kept prefix from the cache, for every item."""
    ours, _, ref, labels, _ = setup
    query = "Fourth profile: restores old bicycles and reads poetry. " * 5 + "\n"
    prompt = ref.prompt_ids(query, OTHER_ITEMS[0])
    reusable = reusable_prefix_len(ref.tokenizer.encode(query), prompt)
    first = ours.score(query, ITEMS[:1], labels)
    again = ours.score(query, OTHER_ITEMS, labels)
    assert first.cached_tokens < reusable  # cold
    assert len(OTHER_ITEMS) * (reusable - 1) <= again.cached_tokens < again.prompt_tokens


def test_a_cold_prefix_group_runs_as_one_forward(setup):
    """SGLang #9748's shape (a 120-token query, 10 items of 180 tokens; one shorter, so
    the leader is known): the query and all of its items in one extend
    (features/prefill_kv/packing.py), the leader computing the query and every other item
    reading it from the leader's slots of the same forward; each item exact against its own
    transformers forward. The same query again: one forward of cache hits. (The scheduler
    checks the pool's slots after every batch.)"""
    ours, _, ref, labels, log_path = setup
    rng = random.Random(62)
    query = [rng.randrange(10, 390) for _ in range(120)]
    items = [[rng.randrange(10, 390) for _ in range(170 if i == 3 else 180)] for i in range(10)]
    before = len(read_events(log_path, "prefill_attention.plan"))
    result = ours.score(query, items, labels)
    want = ref.score(query, items, labels)
    assert max_abs_diff(result.scores, want) < TOLERANCE
    (plan,) = read_events(log_path, "prefill_attention.plan")[before:]  # one forward
    spans = sorted(map(tuple, plan["spans"]))
    leader, followers = spans[0], spans[1:]
    assert leader[0] < len(query) <= sum(leader)  # it computes the query
    assert [prefix for prefix, _ in followers] == [len(query)] * 9  # they read it
    assert sorted(n for _, n in followers) == sorted(len(i) for i in items)[1:]
    assert result.cached_tokens >= 9 * len(query)  # reported as the hits they are
    again = ours.score(query, items[::-1], labels)
    assert max_abs_diff(again.scores, want[::-1]) < TOLERANCE
    (plan,) = read_events(log_path, "prefill_attention.plan")[before + 1 :]
    assert [prefix for prefix, _ in plan["spans"]] == [len(query)] * 10
    forwards = read_events(log_path, "forward")[-2:]  # the forward log (no timers)
    assert [len(f["new"]) for f in forwards] == [10, 10]
    assert sum(forwards[1]["new"]) == sum(map(len, items))
    assert [f["packed"] for f in forwards] == [9, 0]  # followers, then cache hits


def test_a_follower_of_a_shorter_common_prefix_caches_the_rest_of_its_own(setup):
    """Two prompts sharing only their first 40 tokens, sent in one batch (one generate
    call, as score sends its prompts, each with R = 60): the second reads those 40 from
    the first in the same forward, computes and keeps the rest of its own reusable prefix,
    and inserts it into the cache at release (behind the shared part the first inserted):
    a later call on its query hits all 60, and scores exactly."""
    ours, _, ref, labels, log_path = setup
    rng = random.Random(620)
    common = [rng.randrange(10, 390) for _ in range(40)]
    query_a = common + [rng.randrange(10, 390) for _ in range(20)]
    query_b = common + [rng.randrange(10, 390) for _ in range(20)]
    items = [[rng.randrange(10, 390) for _ in range(12)] for _ in range(2)]
    before = len(read_events(log_path, "prefill_attention.plan"))
    params = {"max_new_tokens": 0, "custom_params": {REUSABLE_LEN_KEY: 60}}
    ours._sgl.generate(input_ids=[query_a + items[0], query_b + items[0]], sampling_params=params)
    plans = [
        sorted(map(tuple, p["spans"])) for p in read_events(log_path, "prefill_attention.plan")
    ]
    assert [(0, 72), (40, 32)] in plans[before:], plans[before:]  # one forward, B behind A
    again = ours.score(query_b, items[1:], labels)
    assert again.cached_tokens == len(query_b)  # its own part was cached at release
    assert max_abs_diff(again.scores, ref.score(query_b, items[1:], labels)) < TOLERANCE


def test_the_setwise_readout_keeps_the_prefix_cache(setup):
    """SGLang's setwise readout (score_extraction_token: the labels read at every anchor
    token of each prompt, one matrix per item), which stock serves only with the radix
    cache and chunked prefill off (issue 75): every anchor's log-probabilities within 1e-4
    of transformers on query + item; the cold query's three items in one forward (the
    query computed once, the others packed behind it), the same query's items again as
    cache hits; anchors in the query, an item without one and item_first refused with
    SGLang's own messages."""
    ours, _, ref, labels, log_path = setup
    rng = random.Random(75)
    anchor = 7

    def ids(n):
        return [rng.choice([t for t in range(10, 390) if t != anchor]) for _ in range(n)]

    query = ids(100)
    items = [sum((ids(6) + [anchor] for _ in range(4)), []) for _ in range(3)]
    for round_ in range(2):
        before = len(read_events(log_path, "forward"))
        result = ours.score(
            query, items, labels, apply_softmax=False, score_extraction_token=anchor
        )
        forwards = read_events(log_path, "forward")[before:]
        assert [len(m) for m in result.scores] == [4, 4, 4]
        for item, matrix in zip(items, result.scores, strict=True):
            want = ref.anchor_logprobs(query + item, anchor, labels)
            got = [[math.log(p) for p in row] for row in matrix]
            assert max_abs_diff(got, want) < TOLERANCE
        assert len(forwards) == 1
        if round_ == 0:
            assert forwards[0]["prefix"] == [0, len(query), len(query)]
            assert forwards[0]["packed"] == 2
        else:
            assert forwards[0]["prefix"] == [len(query)] * 3  # the query from the cache
            assert result.cached_tokens >= 3 * len(query)
    with pytest.raises(ValueError, match="shared query prefix"):
        ours.score(query + [anchor], items, labels, score_extraction_token=anchor)
    with pytest.raises(ValueError, match="No score-extraction token"):
        ours.score(query, [*items, ids(5)], labels, score_extraction_token=anchor)
    with pytest.raises(ValueError, match="item_first is not supported"):
        ours.score(query, items, labels, item_first=True, score_extraction_token=anchor)
    with pytest.raises(InvalidRequestError, match="outside the vocabulary"):
        ours.score(query, items, labels, score_extraction_token=10**9)
    with pytest.raises(InvalidRequestError, match="labels of one token each"):
        ours.score(query, items, [[11, 12], [13]], score_extraction_token=anchor)


def test_a_setwise_anchor_in_the_cached_prefix_fails_its_request_not_the_engine(setup):
    """The scheduler-side invariant of the setwise readout (every anchor lies after the
    prefix the cache or a leader gave the request: policy.anchors_in_extend) broken by a
    request built to break it: SGLang's own GenerateReqInput with R, an anchor inside the
    cached query and a logprob start past it (a score call's is its first anchor, which
    bounds the match). That request gets an error naming the problem; the scheduler lives
    (its strict memory check finds nothing leaked) and answers the next setwise call
    exactly, the cached query included."""
    from fastapi import HTTPException
    from sglang.srt.managers.io_struct import GenerateReqInput

    ours, _, ref, labels, _ = setup
    rng = random.Random(84)
    anchor = 7

    def ids(n):
        return [rng.choice([t for t in range(10, 390) if t != anchor]) for _ in range(n)]

    query = ids(60)
    items = [ids(5) + [anchor] for _ in range(2)]
    ours.score(query, items, labels, apply_softmax=False, score_extraction_token=anchor)
    prompt = query + items[0]
    bad = GenerateReqInput(
        input_ids=[prompt],
        sampling_params={"max_new_tokens": 0, "custom_params": {REUSABLE_LEN_KEY: len(query)}},
        return_logprob=True,
        logprob_start_len=len(prompt) - 1,  # no bound at the anchors: the query is a hit
        token_ids_logprob=labels,
        token_indices_to_pool=[[30, len(prompt) - 1]],  # 30: inside the cached query
    )
    tokenizer_manager = ours._sgl.tokenizer_manager
    with pytest.raises(HTTPException) as failed:
        ours._sgl.loop.run_until_complete(tokenizer_manager.generate_request(bad).__anext__())
    assert failed.value.status_code == 500
    assert "score-extraction anchor at 30 lies in the 60 tokens" in failed.value.detail
    assert "this request failed" in failed.value.detail
    result = ours.score(query, items, labels, apply_softmax=False, score_extraction_token=anchor)
    assert result.cached_tokens >= 2 * len(query)
    for item, matrix in zip(items, result.scores, strict=True):
        want = ref.anchor_logprobs(query + item, anchor, labels)
        assert max_abs_diff([[math.log(p) for p in row] for row in matrix], want) < TOLERANCE


def test_a_reusable_length_a_client_garbled_runs_the_request_stock(setup):
    """custom_params reach the scheduler from clients too (SGLang's generate): a reusable
    length that is not a number, read there by every prefill-only KV hook, makes the
    request a stock one (messages.reusable_len_in) instead of an exception in the
    scheduler's loop; the engine then scores as before."""
    ours, _, ref, labels, _ = setup
    prompt = ref.prompt_ids(PROFILE, ITEMS[1])
    for garbled in ("all of it", [3], None):
        params = {"max_new_tokens": 0, "custom_params": {REUSABLE_LEN_KEY: garbled}}
        out = ours._sgl.generate(input_ids=prompt, sampling_params=params)
        assert out["meta_info"]["prompt_tokens"] == len(prompt)
    _check(setup, PROFILE, ITEMS[:2])


def test_a_text_call_with_labels_of_several_tokens_computes_its_cold_query_once(setup):
    """A text query and items (sent to SGLang as token ids, so its prompts reach the
    scheduler together: scoring/text_prompts.py) with labels of several tokens (whose
    prompts are kept whole for their continuations, yet grouped by the query they share:
    prefill_kv/messages.py's shared length): the first round is one forward, the leader
    computing the query and the other items riding behind it; the scores exact."""
    ours, _, ref, labels, log_path = setup
    query = "User profile: reads history, science and travel books every week. " * 4
    items = [f"Item {i}: a book about the {w}. Relevant?" for i, w in enumerate(
        ("moon landing", "roman empire", "alps", "printing press"))]  # fmt: skip
    several = [[labels[0], labels[1]], [labels[1]]]  # " Yes No", " No"
    before = len(read_events(log_path, "forward"))
    result = ours.score(query, items, several)
    want = ref.score_sequences(query, items, several)
    assert max_abs_diff(result.scores, want) < TOLERANCE
    first = read_events(log_path, "forward")[before]
    assert len(first["new"]) == len(items)  # the query and all of its items: one forward
    assert first["packed"] == len(items) - 1  # the others behind the leader
