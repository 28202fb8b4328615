"""The OpenAI-compatible doors against a real `prefillonly serve` (tiny Llama, float32, a
1,024-token KV pool), through the real clients.

Single-token requests through the official `openai` client (sync and async): the
logprobs equal a plain transformers forward (reference.next_token_logprobs) within 1e-4,
with and without logit_bias and for named token ids; a chat prompt 3x the pool answers;
a streamed one answers one chunk per choice; requests of two tokens keep SGLang's path.

Loglikelihood requests (echo + logprobs): prompt logprobs against the reference, and
lm-evaluation-harness's `local-completions` model against lm-eval's own `hf` backend on
the repository's drug-review task (evals/drug_sentiment/), reduced."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import requests
from conftest import tiny_server
from openai import AsyncOpenAI, BadRequestError

pytestmark = pytest.mark.slow  # its own server and the openai / lm-eval clients

POOL = 1024
TOL = 1e-4
EVALS = Path(__file__).resolve().parents[1] / "evals" / "drug_sentiment"
SYSTEM = "You label reviews as Yes (positive) or No (negative). " * 6
FEW_SHOT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Review: works great"},
    {"role": "assistant", "content": "Yes"},
    {"role": "user", "content": "Review: awful taste"},
    {"role": "assistant", "content": "No"},
]


def chat(review: str) -> list[dict]:
    return [*FEW_SHOT, {"role": "user", "content": f"Review: {review}"}]


server = tiny_server("--max-total-tokens", str(POOL))


def chat_ids(reference, messages) -> list[int]:
    """The prompt as the model folder's own template renders it (transformers)."""
    return list(
        reference.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


def assert_top_logprobs(entries, expected, k: int, tol: float = TOL) -> None:
    """The k returned top logprobs are the k largest of the reference distribution."""
    got = [e.logprob for e in entries]
    want = sorted(expected.tolist(), reverse=True)[:k]
    assert len(got) == k
    assert max(abs(a - b) for a, b in zip(got, want)) < tol, (got, want)


def test_chat_top_logprobs_match_transformers(client, reference):
    messages = chat("the pills cured my headache")
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=5,
    )  # fmt: skip
    ids = chat_ids(reference, messages)
    expected = reference.next_token_logprobs(ids)
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == len(ids)
    assert answer.usage.completion_tokens == 1 and choice.finish_reason == "length"
    position = choice.logprobs.content[0]
    best = int(expected.argmax())
    assert position.token == reference.tokenizer.decode([best])
    assert abs(position.logprob - float(expected[best])) < TOL
    assert_top_logprobs(position.top_logprobs, expected, 5)


def test_chat_logit_bias_applies_before_the_choice_and_to_the_logprobs(client, reference):
    messages = chat("no effect at all")
    ids = chat_ids(reference, messages)
    raw = reference.next_token_logprobs(ids)
    low = int(raw.argsort()[len(raw) // 2])  # a middling token, lifted to the top
    bias = {low: 12.0, int(raw.argmax()): -5.0}
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=4, logit_bias={str(t): b for t, b in bias.items()},
    )  # fmt: skip
    expected = reference.next_token_logprobs(ids, bias)
    position = answer.choices[0].logprobs.content[0]
    assert position.token == reference.tokenizer.decode([int(expected.argmax())])
    assert_top_logprobs(position.top_logprobs, expected, 4)


def test_logprob_token_ids_whatever_their_rank(client, reference):
    messages = chat("it made me dizzy")
    ids = chat_ids(reference, messages)
    raw = reference.next_token_logprobs(ids)
    order = raw.argsort().tolist()
    named = [order[0], order[-1], order[len(order) // 3]]  # the least likely one too
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
        extra_body={"logprob_token_ids": named},
    )  # fmt: skip
    entries = answer.choices[0].logprobs.content[0].top_logprobs
    assert [e.token for e in entries] == [reference.tokenizer.decode([t]) for t in named]
    for entry, token in zip(entries, named):
        assert abs(entry.logprob - float(raw[token])) < TOL


def test_completions_async_with_shared_prefix_and_named_ids(server, reference):
    prefix = "User profile: likes science fiction and history books.\n"
    prompts = [prefix + "Item: a moon documentary. Relevant?", prefix + "Item: socks. Relevant?"]
    tok = reference.tokenizer
    labels = [tok.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]

    async def ask():
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        async with client:
            answer = await client.completions.create(
                model="m", prompt=prompts, max_tokens=1, temperature=0, logprobs=3,
                extra_body={"shared_prefix": prefix},
            )  # fmt: skip
            named = await client.completions.create(
                model="m", prompt=prompts, max_tokens=1, temperature=0, logprobs=0,
                extra_body={"logprob_token_ids": labels},
            )  # fmt: skip
        return answer, named

    answer, named = asyncio.run(ask())
    assert [c.index for c in answer.choices] == [0, 1]
    for choice, labelled, prompt in zip(answer.choices, named.choices, prompts):
        expected = reference.next_token_logprobs(tok.encode(prompt))
        best = int(expected.argmax())
        assert len(choice.logprobs.tokens) == 1 and choice.logprobs.text_offset == [0]
        assert abs(choice.logprobs.token_logprobs[0] - float(expected[best])) < TOL
        top = sorted(choice.logprobs.top_logprobs[0].values(), reverse=True)
        want = sorted(expected.tolist(), reverse=True)[:3]
        assert max(abs(a - b) for a, b in zip(top, want)) < TOL
        got = labelled.logprobs.top_logprobs[0]
        # vLLM's semantics: the sampled token too (as the choice renders it)
        sampled = [] if best in labels else [labelled.logprobs.tokens[0]]
        assert list(got) == [tok.decode([t]) for t in labels] + sampled
        for text, token in zip(got, labels):
            assert abs(got[text] - float(expected[token])) < TOL
    # The marked prefix was kept: the second call found it (and its prompts) cached.
    assert named.usage.prompt_tokens_details.cached_tokens >= len(tok.encode(prefix)) - 1


def test_completions_logit_bias(client, reference):
    prompt = "Review: the tablets tasted of chalk but worked.\nSentiment:"
    ids = reference.tokenizer.encode(prompt)
    raw = reference.next_token_logprobs(ids)
    bias = {int(raw.argsort()[10]): 9.0, int(raw.argmax()): -2.5}
    answer = client.completions.create(
        model="m", prompt=prompt, max_tokens=1, temperature=0, logprobs=3,
        logit_bias={str(t): b for t, b in bias.items()},
    )  # fmt: skip
    expected = reference.next_token_logprobs(ids, bias)
    logprobs = answer.choices[0].logprobs
    assert abs(logprobs.token_logprobs[0] - float(expected.max())) < TOL
    top = sorted(logprobs.top_logprobs[0].values(), reverse=True)
    want = sorted(expected.tolist(), reverse=True)[:3]
    assert max(abs(a - b) for a, b in zip(top, want)) < TOL, (top, want)


def test_only_the_history_is_kept_in_the_prefix_cache(client, reference):
    """The shared history is a cache hit for the next review; the last message is not
    kept (asked again, only the history is cached)."""
    first = client.chat.completions.create(
        model="m", messages=chat("first review, long enough to matter " * 4), max_tokens=1,
        temperature=0,
    )  # fmt: skip
    assert first.usage.completion_tokens == 1
    messages = chat("second review " * 8)
    rendered = reference.tokenizer.apply_chat_template(
        FEW_SHOT, add_generation_prompt=False, tokenize=True, return_dict=False
    )
    history = len(rendered) - 2  # the rendering's last tokens may differ once a turn follows
    again = [
        client.chat.completions.create(model="m", messages=messages, max_tokens=1, temperature=0)
        for _ in range(2)
    ]
    total = len(chat_ids(reference, messages))
    for answer in again:
        cached = answer.usage.prompt_tokens_details.cached_tokens
        assert history <= cached < total - 8, (cached, history, total)


def test_chat_prompt_three_times_the_pool(client, reference):
    messages = chat("great " * 520)
    ids = chat_ids(reference, messages)
    assert len(ids) > 3 * POOL
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=2,
    )  # fmt: skip
    expected = reference.next_token_logprobs(ids)
    assert answer.usage.prompt_tokens == len(ids)
    # 1e-3, not 1e-4: a logprob after ~1,600 tokens, summed over the whole prompt in another
    # order than transformers' (the pool's chunks): float32 rounding grows with the length
    # (2.3e-4 measured once on a 2-core EPYC, 2026-11-26; issue 63).
    assert_top_logprobs(answer.choices[0].logprobs.content[0].top_logprobs, expected, 2, 1e-3)
    # Two tokens need every prompt token's KV for the decode step: SGLang's limit.
    with pytest.raises(BadRequestError, match="exceeds the maximum allowed length"):
        client.chat.completions.create(model="m", messages=messages, max_tokens=2)


def test_two_tokens_still_generate_as_before(client, reference):
    """max_tokens=2 runs SGLang's generation: the greedy tokens of transformers."""
    import torch

    messages = chat("a second opinion")
    ids = chat_ids(reference, messages)
    with torch.no_grad():
        out = reference.model.generate(
            torch.tensor([ids]), max_new_tokens=2, do_sample=False, pad_token_id=0
        )
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=2, temperature=0, logprobs=True
    )
    tokens = [p.token for p in answer.choices[0].logprobs.content]
    assert tokens == [reference.tokenizer.decode([t]) for t in out[0, len(ids) :].tolist()]
    assert answer.usage.completion_tokens == 2


def test_stream_is_one_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=chat("fine"),
            max_tokens=1,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
    )
    assert len(chunks) == 2  # the token, then the usage chunk ([DONE] ends the stream)
    first, usage = chunks
    assert first.choices[0].delta.role == "assistant"
    assert first.choices[0].finish_reason == "length"
    assert len(first.choices[0].logprobs.content[0].top_logprobs) == 2
    assert usage.choices == [] and usage.usage.completion_tokens == 1


def computed_tokens(server) -> float:
    """Prompt tokens the server computed so far (not served from the prefix cache), from
    SGLang's Prometheus counters."""
    totals = {"sglang:prompt_tokens_total": 0.0, "sglang:cached_tokens_total": 0.0}
    for line in requests.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["sglang:prompt_tokens_total"] - totals["sglang:cached_tokens_total"]


def test_n_samples_stop_and_seed(server, client, reference):
    messages = [{"role": "system", "content": "A history nobody sent before. " * 5},
                *chat("so-so")[1:]]  # fmt: skip
    before = computed_tokens(server)
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=1.0, seed=7, n=3,
        logprobs=True, top_logprobs=3,
    )  # fmt: skip
    computed = computed_tokens(server) - before
    assert len(answer.choices) == 3
    tops = [[e.logprob for e in c.logprobs.content[0].top_logprobs] for c in answer.choices]
    assert all(max(abs(a - b) for a, b in zip(t, tops[0])) < TOL for t in tops)  # one distribution
    # One prefill of the prompt, then each sample a one-token hit of it.
    assert computed <= len(chat_ids(reference, messages)) + 3, computed
    greedy = client.chat.completions.create(model="m", messages=messages, max_tokens=1,
                                            temperature=0)  # fmt: skip
    word = greedy.choices[0].message.content
    stopped = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, stop=[word]
    )
    if word.strip():  # a stop string the sampled token matches
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.choices[0].message.content == ""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be an integer from 0 to 20"),
        ({"logit_bias": {"3": 101}}, "logit_bias[3] must be a number from -100 to 100"),
        ({"logit_bias": {"999999": 1}}, "logit_bias keys must be token ids"),
        ({"extra_body": {"logprob_token_ids": [1, 2]}}, "logprob_token_ids needs logprobs"),
        ({"logprobs": True, "extra_body": {"logprob_token_ids": [1, 1]}}, "duplicate"),
        ({"max_tokens": 2, "logprobs": True, "extra_body": {"logprob_token_ids": [1]}},
         "applies to single-token requests"),
    ],
)  # fmt: skip
def test_bad_single_token_requests_name_the_field(client, extra, message):
    body = {"model": "m", "messages": chat("x"), "max_tokens": 1, **extra}
    with pytest.raises(BadRequestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        client.chat.completions.create(**body)


def test_bad_shared_prefix_names_the_prompt(client):
    with pytest.raises(BadRequestError, match=r"prompt\[1\] does not start with shared_prefix"):
        client.completions.create(
            model="m", prompt=["ab cd", "xy"], max_tokens=1, extra_body={"shared_prefix": "ab"}
        )


# -- loglikelihood requests (echo + logprobs; issue 35's contract, first part) -----------
def test_echo_returns_every_prompt_position(client, reference):
    """lm-eval's request: token ids, echo, logprobs, max_tokens 1 (or 0, as older versions
    send): the prompt's positions (the first None), then the generated token's."""
    ids = reference.tokenizer.encode("Question: which planet is largest?\nAnswer: Jupiter")
    expected = reference.prompt_logprobs(ids)
    for max_tokens in (0, 1):
        answer = client.completions.create(
            model="m", prompt=[ids], max_tokens=max_tokens, echo=True, logprobs=1,
            temperature=0,
        )  # fmt: skip
        logprobs = answer.choices[0].logprobs
        assert len(logprobs.token_logprobs) == len(ids) + max_tokens
        assert logprobs.token_logprobs[0] is None
        got = logprobs.token_logprobs[1 : len(ids)]
        assert max(abs(a - b) for a, b in zip(got, expected[1:])) < TOL


SHOTS = "".join(f"Question: what is {i} plus {i}?\nAnswer: {2 * i}\n\n" for i in range(10))


def flush(server) -> None:
    assert requests.post(f"{server.url}/flush_cache", timeout=60).status_code == 200


def echo(client, prompt, top: int = 2, max_tokens: int = 1):
    return client.completions.create(
        model="m", prompt=prompt, max_tokens=max_tokens, echo=True, logprobs=top,
        temperature=0,
    )  # fmt: skip


def assert_echo_contract(logprobs, ids, expected) -> None:
    """OpenAI's echo fields as lm-eval reads them: every prompt position (token 0 None),
    within TOL of the reference, the argmax's top entry identical to its token logprob,
    text offsets into the echoed text."""
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    got = logprobs.token_logprobs[1 : len(ids)]
    assert max(abs(a - b) for a, b in zip(got, expected[1:])) < TOL
    for token, value, top in zip(logprobs.tokens[1:], got, logprobs.top_logprobs[1:]):
        if token in top:
            assert top[token] == value
    lengths = [len(t) for t in logprobs.tokens]
    assert logprobs.text_offset == [sum(lengths[:i]) for i in range(len(lengths))]


def test_echo_requests_share_their_task_through_the_prefix_cache(server, client, reference):
    """A few-shot task's requests: each computes only what the cache lacks (its first new
    position recomputes the last cached one) and still returns every position; the cached
    positions' entries are exactly those the first request computed."""
    flush(server)
    prompts = [SHOTS + "Question: what is 3 plus 2?\nAnswer: 5", SHOTS + "Question: what is "
               "3 plus 2?\nAnswer: six"]  # fmt: skip
    ids = [reference.tokenizer.encode(p) for p in prompts]
    first = echo(client, [ids[0]])
    second = echo(client, [ids[1]])
    again = echo(client, [ids[0]])
    shared = next(i for i, (a, b) in enumerate(zip(*ids)) if a != b)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens == shared - 1
    assert again.usage.prompt_tokens_details.cached_tokens == len(ids[0]) - 2
    for answer, prompt_ids in ((first, ids[0]), (second, ids[1]), (again, ids[0])):
        logprobs = answer.choices[0].logprobs
        assert len(logprobs.token_logprobs) == len(prompt_ids) + 1
        assert_echo_contract(logprobs, prompt_ids, reference.prompt_logprobs(prompt_ids))
    cold, warm = first.choices[0].logprobs, again.choices[0].logprobs
    n = len(ids[0]) - 1  # entries of tokens 1..T-2 came from the table
    assert warm.token_logprobs[:n] == cold.token_logprobs[:n]
    assert warm.top_logprobs[:n] == cold.top_logprobs[:n]
    wider = echo(client, [ids[0]], top=5).choices[0].logprobs  # k 5: the rows hold 2
    assert all(len(top) >= 5 for top in wider.top_logprobs[1:])


def test_echo_entries_never_outlive_their_kv(server, client, reference):
    """After a flush the allocator hands the same slots to other tokens: a prompt cached
    by a request without echo must not find the old entries in its slots."""
    flush(server)
    echo(client, [reference.tokenizer.encode("Review: the tablets were useless. " * 8)])
    flush(server)
    prefix = SHOTS + "Question: what is 7 plus 7?"
    client.completions.create(model="m", prompt=prefix + "\nAnswer: 14", max_tokens=1,
                              extra_body={"shared_prefix": prefix})  # fmt: skip
    ids = reference.tokenizer.encode(prefix + "\nAnswer: 15")
    logprobs = echo(client, [ids]).choices[0].logprobs
    assert_echo_contract(logprobs, ids, reference.prompt_logprobs(ids))


def test_echo_takes_all_four_prompt_forms(client, reference):
    texts = ["Question: is the sky blue?\nAnswer: yes", "Question: is grass red?\nAnswer: no"]
    ids = [reference.tokenizer.encode(t) for t in texts]
    for prompt, expected_ids in (
        (texts[0], ids[:1]),
        (texts, ids),
        (ids[1], ids[1:]),
        (ids, ids),
    ):
        answer = echo(client, prompt, max_tokens=0)
        assert [c.index for c in answer.choices] == list(range(len(expected_ids)))
        for choice, prompt_ids in zip(answer.choices, expected_ids):
            assert len(choice.logprobs.token_logprobs) == len(prompt_ids)  # max_tokens 0
            assert_echo_contract(choice.logprobs, prompt_ids, reference.prompt_logprobs(prompt_ids))


def test_echo_longer_than_the_pool_is_answered_and_past_the_context_named(client, reference):
    """A loglikelihood prompt 1.5x the pool keeps what fits and is still answered in full;
    one past the context (4,096) is a 400 naming the length, never an out-of-memory."""
    ids = reference.tokenizer.encode("Review: the capsules helped my sleep a lot. " * 200)
    ids = ids[: POOL * 3 // 2]
    logprobs = echo(client, [ids], max_tokens=0).choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(ids)
    assert_echo_contract(logprobs, ids, reference.prompt_logprobs(ids))
    with pytest.raises(BadRequestError, match="longer than|exceeds|maximum"):
        echo(client, [ids * 4])


def test_zero_tokens_without_echo_is_named(client):
    with pytest.raises(BadRequestError, match="max_tokens: 0 generates nothing"):
        client.completions.create(model="m", prompt="hello", max_tokens=0)


def test_tokenizer_info(server, reference):
    info = requests.get(f"{server.url}/tokenizer_info", timeout=30).json()
    tok = reference.tokenizer
    assert info["eos_token"] == tok.eos_token and info["eos_token_id"] == tok.eos_token_id
    assert info["bos_token"] == tok.bos_token
    assert info["chat_template"] == tok.chat_template
    assert info["model_max_length"] == 4096 and info["vocab_size"] == len(tok)
    # lm-eval's remote tokenizer: /tokenize's "tokens", /detokenize's "prompt" (vLLM's key)
    ids = requests.post(f"{server.url}/tokenize", json={"prompt": "Hello there",
                        "add_special_tokens": False}, timeout=30).json()["tokens"]  # fmt: skip
    assert ids == tok.encode("Hello there", add_special_tokens=False)
    text = requests.post(f"{server.url}/detokenize", json={"tokens": ids}, timeout=30).json()
    assert text["prompt"] == text["text"] == tok.decode(ids)


def test_lm_eval_local_completions_matches_its_hf_backend(server, tiny_llama_path, tmp_path):
    """lm-eval as a user runs it (token-id prompts, echo, logprobs): every request's
    loglikelihood within 1e-4 of lm-eval's `hf` backend on the same model, the same
    is_greedy. Reduced: 4 questions x 3 choices, 2-shot."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    yaml = (EVALS / "drug_sentiment.yaml").read_text()
    for split in ("test", "train"):  # data paths made absolute (the yaml's are the repo's)
        yaml = yaml.replace(f"evals/drug_sentiment/{split}.jsonl", str(EVALS / f"{split}.jsonl"))
    (tasks / "drug_sentiment.yaml").write_text(yaml)
    common = dict(
        tasks=["drug_sentiment"], task_manager=TaskManager(include_path=str(tasks)),
        num_fewshot=2, limit=4, log_samples=True, bootstrap_iters=0,
    )  # fmt: skip
    ours = simple_evaluate(
        model="local-completions",
        model_args=f"model=m,base_url={server.url}/v1/completions,tokenizer_backend="
        f"huggingface,tokenizer={tiny_llama_path},tokenized_requests=True",
        **common,
    )
    theirs = simple_evaluate(model="hf", model_args=f"pretrained={tiny_llama_path},"
                             "dtype=float32", device="cpu", **common)  # fmt: skip

    def per_request(results):
        return [
            (sample["doc_id"], choice, resp[0])
            for sample in results["samples"]["drug_sentiment"]
            for choice, resp in enumerate(sample["resps"])
        ]

    got, want = per_request(ours), per_request(theirs)
    assert len(got) == len(want) == 12
    assert len({round(ll, 3) for _, _, (ll, _) in got}) > 6  # real, distinct values
    for (doc, choice, (ll, greedy)), (doc_w, choice_w, (ll_w, greedy_w)) in zip(got, want):
        assert (doc, choice) == (doc_w, choice_w)
        assert abs(ll - ll_w) < TOL, (doc, choice, ll, ll_w)
        assert greedy == greedy_w, (doc, choice)


# -- vLLM's allowed_token_ids (single_token/allowed_tokens.py) -----------------------------


def test_allowed_token_ids_pick_the_best_allowed_token_with_the_raw_logprobs(client, reference):
    """A single-token request restricted to a set: the answer is the most likely allowed
    token (greedy), and every logprob is the unrestricted one (vLLM's raw_logprobs), the
    answer's and the top-k alike, against transformers."""
    messages = chat("the pills cured my headache")
    ids = chat_ids(reference, messages)
    raw = reference.next_token_logprobs(ids)
    order = raw.argsort(descending=True)
    allowed = [int(order[40]), int(order[7]), int(order[300])]  # the best: order[7]
    answer = client.chat.completions.create(
        model="m", messages=messages, max_tokens=1, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"allowed_token_ids": allowed},
    )  # fmt: skip
    choice = answer.choices[0]
    position = choice.logprobs.content[0]
    assert position.token == reference.tokenizer.decode([int(order[7])])
    assert choice.message.content == position.token and choice.finish_reason == "length"
    assert abs(position.logprob - float(raw[int(order[7])])) < TOL
    assert_top_logprobs(position.top_logprobs, raw, 3)  # the natural top 3, unrestricted
    # sampled (temperature 1, a seed): always one of the allowed
    for seed in range(4):
        answer = client.completions.create(
            model="m", prompt="Review: fine.\nSentiment:", max_tokens=1, temperature=1.0,
            seed=seed, logprobs=0, extra_body={"allowed_token_ids": allowed[:2],
                                               "return_tokens_as_token_ids": True},
        )  # fmt: skip
        token = answer.choices[0].logprobs.tokens[0]
        assert int(token.removeprefix("token_id:")) in allowed[:2]


def test_allowed_token_ids_restrict_every_generated_token(client, reference):
    """More than one token: SGLang's sampler restricted at every step."""
    allowed = reference.tokenizer.encode(" yes no", add_special_tokens=False)
    answer = client.completions.create(
        model="m", prompt="Review: fine.\nSentiment:", max_tokens=4, temperature=0,
        extra_body={"allowed_token_ids": allowed, "ignore_eos": True},
    )  # fmt: skip
    generated = reference.tokenizer.encode(answer.choices[0].text, add_special_tokens=False)
    assert len(generated) == 4 and set(generated) <= set(allowed)


@pytest.mark.parametrize("bad", [[], [-1], [10**9], ["5"], [1.5], "5"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_bad_allowed_token_ids_are_a_400_naming_the_field(server, path, bad):
    body = {"model": "m", "max_tokens": 1, "allowed_token_ids": bad}
    if path == "/v1/completions":
        body["prompt"] = "Hello"
    else:
        body["messages"] = [{"role": "user", "content": "Hello"}]
    response = requests.post(f"{server.url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    answer = response.json()  # SGLang's OpenAI error envelope
    assert answer["object"] == "error" and "allowed_token_ids" in answer["message"]
