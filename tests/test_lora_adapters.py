"""LoRA adapters per request through the prefill-only runtime (issue 76), on CPU: two r=8
adapters made with `peft` on the tiny Llama (every projection of every layer, random A and
B so each changes the answers), served by one engine (SGLang's --enable-lora with its
torch backend; cpu_support keeps its host tensors unpinned). Each call's adapter
(`lora_path`) gives label probabilities within 1e-4 of transformers with that adapter
merged (peft's merge_and_unload), and the base model's without one; a query cached under
one adapter is reported cached under it only (the radix cache keys by adapter); calls
under both adapters sent at once are each exact; an unknown adapter is refused by name.
The server: the body's `lora_path` on /v1/score and /v1/score_labels (doors whose request
models have no such field: the guard takes it).
"""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
import requests
from conftest import max_abs_diff
from pydantic import BaseModel, Field

import prefillonly_sgl as prefillonly
from prefillonly_sgl import Engine
from prefillonly_sgl.dsl import Prompt
from prefillonly_sgl.verification.reference import TransformersReference

TOLERANCE = 1e-4  # float32 engine vs float32 transformers (merged adapter)
QUERY = list(range(20, 100))  # an 80-token shared prefix
ITEMS = [[130, 131, 132], [140, 141], [150]]


def _adapter(base: str, out, seed: int):
    """A random r=8 adapter of every projection (models/tiny_adapters.py), saved to `out`;
    and the base with it merged (peft's merge_and_unload), saved beside."""
    from transformers import AutoTokenizer

    from prefillonly_sgl.models.tiny_adapters import build_lora_adapter

    path, peft_model = build_lora_adapter(base, out / "adapter", seed)
    merged = peft_model.merge_and_unload()
    merged.save_pretrained(out / "merged")
    AutoTokenizer.from_pretrained(base).save_pretrained(out / "merged")
    return path, TransformersReference(str(out / "merged"))


@pytest.fixture(scope="module")
def adapters(tiny_llama_path, tmp_path_factory):
    made = {}
    for seed, name in enumerate(("a", "b")):
        made[name] = _adapter(str(tiny_llama_path), tmp_path_factory.mktemp(f"lora-{name}"), seed)
    return made


@pytest.fixture(scope="module")
def lora_engine(tiny_llama_path, adapters):
    with Engine(
        tiny_llama_path,
        device="cpu",
        dtype="float32",
        max_total_tokens=4096,
        enable_lora=True,
        lora_paths=[f"{name}={path}" for name, (path, _) in adapters.items()],
        max_loras_per_batch=2,
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def labels(tiny_llama_path):
    ref = TransformersReference(str(tiny_llama_path))
    return [ref.tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Yes", " No")]


def test_each_adapter_equals_transformers_with_it_merged(
    lora_engine, adapters, labels, tiny_llama_path
):
    base = TransformersReference(str(tiny_llama_path))
    plain = lora_engine.score(QUERY, ITEMS, labels).scores
    assert max_abs_diff(plain, base.score(QUERY, ITEMS, labels)) < TOLERANCE
    for name, (_, merged) in adapters.items():
        got = lora_engine.score(QUERY, ITEMS, labels, lora_path=name).scores
        assert max_abs_diff(got, merged.score(QUERY, ITEMS, labels)) < TOLERANCE, name
        assert max_abs_diff(got, plain) > 100 * TOLERANCE  # the adapter counts


def test_a_prefix_cached_under_one_adapter_is_not_read_under_another(lora_engine, labels):
    query = list(range(200, 290))
    lora_engine.score(query, ITEMS, labels, lora_path="a")
    again = lora_engine.score(query, ITEMS, labels, lora_path="a")
    assert again.cached_tokens >= 3 * len(query)
    other = lora_engine.score(query, ITEMS, labels, lora_path="b")
    assert other.cached_tokens == 2 * len(query)  # its own query once, packed: none of a's
    base = lora_engine.score(query, ITEMS[:1], labels)
    assert base.cached_tokens == 0


def test_calls_under_both_adapters_at_once(lora_engine, adapters, labels):
    query = list(range(300, 380))

    async def both():
        return await asyncio.gather(
            *(lora_engine.async_score(query, ITEMS, labels, lora_path=n) for n in ("a", "b"))
        )

    for name, result in zip(("a", "b"), lora_engine.run_until_complete(both()), strict=True):
        want = adapters[name][1].score(query, ITEMS, labels)
        assert max_abs_diff(result.scores, want) < TOLERANCE, name


def test_an_unknown_adapter_is_refused(lora_engine, labels):
    with pytest.raises(ValueError, match="nope"):
        lora_engine.score(QUERY, ITEMS, labels, lora_path="nope")
    with pytest.raises(ValueError, match="lora_path must be an adapter's name"):
        lora_engine.score(QUERY, ITEMS, labels, lora_path=3)


@pytest.fixture(scope="module")
def lora_server(tiny_llama_path, adapters, tmp_path_factory):
    from server_process import running_server

    paths = [f"{name}={path}" for name, (path, _) in adapters.items()]
    log = tmp_path_factory.mktemp("lora-serve") / "serve.log"
    args = ("--enable-lora", "--lora-paths", *paths, "--max-loras-per-batch", "2")
    with running_server(tiny_llama_path, log, *args) as server:
        yield server


def test_the_scoring_doors_take_lora_path(lora_server, adapters, labels):
    """/v1/score (SGLang's request model has no lora_path) and /v1/score_labels: the
    body's adapter; without one, the base model."""
    for name, (_, merged) in adapters.items():
        body = {"query": QUERY, "items": ITEMS, "label_token_ids": labels, "lora_path": name}
        body["apply_softmax"] = True  # SGLang's default is false
        answer = requests.post(f"{lora_server.url}/v1/score", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        want = merged.score(QUERY, ITEMS, labels)
        assert max_abs_diff(answer.json()["scores"], want) < TOLERANCE, name
        body = {"query": "Q", "items": ["a", "b"], "label_token_ids": labels, "lora_path": name}
        answer = requests.post(f"{lora_server.url}/v1/score_labels", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        want = merged.score("Q", ["a", "b"], labels)
        assert max_abs_diff(answer.json()["rows"], want) < TOLERANCE, name
    refused = requests.post(
        f"{lora_server.url}/v1/score",
        json={"query": QUERY, "items": ITEMS, "label_token_ids": labels, "lora_path": 7},
        timeout=60,
    )
    assert refused.status_code == 400 and "lora_path" in refused.text


def test_a_dsl_function_bound_to_an_adapter(lora_engine, adapters, labels):
    """@classifier(lora_path=NAME): every request it sends runs under that adapter, on the
    Engine as through a server (RemoteBackend sends the body's lora_path)."""
    import prefillonly_sgl as prefillonly

    @prefillonly.classifier(labels=["Yes", "No"], lora_path="b")
    def relevant(text: str) -> str:
        return text

    (request,) = relevant.compile(lora_engine.tokenizer, "Item: socks. Relevant?").requests
    assert request.lora_path == "b"
    result = relevant("Item: socks. Relevant?", engine=lora_engine)
    want = adapters["b"][1].score(request.query, list(request.items), list(request.label_token_ids))
    assert max_abs_diff([[result.probs["Yes"], result.probs["No"]]], want) < TOLERANCE
    with pytest.raises(Exception, match="lora_path must be an adapter's name"):
        prefillonly.classifier(labels=["Yes", "No"], lora_path=5)(lambda text: text)


def test_a_bound_function_through_remote_backend(lora_server, adapters, lora_engine):
    """The same function on a RemoteBackend: its /v1/score body carries lora_path."""
    import prefillonly_sgl as prefillonly
    from prefillonly_sgl.dsl import RemoteBackend

    @prefillonly.classifier(labels=["Yes", "No"], lora_path="a")
    def relevant(text: str) -> str:
        return text

    text = "Item: a kettle. Relevant?"
    (request,) = relevant.compile(lora_engine.tokenizer, text).requests
    result = relevant(text, engine=RemoteBackend(lora_server.url))
    want = adapters["a"][1].score(request.query, list(request.items), list(request.label_token_ids))
    assert max_abs_diff([[result.probs["Yes"], result.probs["No"]]], want) < TOLERANCE


def test_vllm_convention_the_model_names_the_adapter(lora_server, adapters, labels):
    """vLLM's convention: `"model": "<adapter>"` runs the request under that adapter, on a
    scoring door (/v1/score) and on OpenAI's completions (the greedy token's logprob)."""
    for name, (_, merged) in adapters.items():
        body = {"query": QUERY, "items": ITEMS, "label_token_ids": labels, "model": name}
        body["apply_softmax"] = True
        answer = requests.post(f"{lora_server.url}/v1/score", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        want = merged.score(QUERY, ITEMS, labels)
        assert max_abs_diff(answer.json()["scores"], want) < TOLERANCE, name
        prompt = "Item: a kettle. Relevant?"
        body = {"model": name, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        answer = requests.post(
            f"{lora_server.url}/v1/completions", json={**body, "logprobs": 1}, timeout=120
        )
        assert answer.status_code == 200, answer.text
        got = answer.json()["choices"][0]["logprobs"]["token_logprobs"][0]
        want = float(merged.next_token_logprobs(merged.tokenizer.encode(prompt)).max())
        assert abs(got - want) < TOLERANCE, name


def test_adapters_load_and_unload_at_run_time(lora_engine, adapters, labels, lora_server):
    """Engine.load_lora_adapter / unload_lora_adapter, and the server's routes: an adapter
    loaded under a new name answers as itself; SGLang 0.5.23 keeps an unloaded adapter's
    reference and loads it again for the next request naming it (its "evicted adapter"
    reload), which answers as before; a name never loaded is refused."""
    path, merged = adapters["a"]
    want = merged.score(QUERY, ITEMS, labels)
    answer = lora_engine.load_lora_adapter("a2", str(path))
    assert answer.success, answer.error_message
    got = lora_engine.score(QUERY, ITEMS, labels, lora_path="a2").scores
    assert max_abs_diff(got, want) < TOLERANCE
    assert lora_engine.unload_lora_adapter("a2").success
    again = lora_engine.score(QUERY, ITEMS, labels, lora_path="a2").scores
    assert max_abs_diff(again, want) < TOLERANCE
    with pytest.raises(ValueError, match="never been loaded: a4"):
        lora_engine.score(QUERY, ITEMS, labels, lora_path="a4")
    loaded = requests.post(
        f"{lora_server.url}/load_lora_adapter",
        json={"lora_name": "a3", "lora_path": str(path)},
        timeout=120,
    )
    assert loaded.status_code == 200, loaded.text
    body = {"query": QUERY, "items": ITEMS, "label_token_ids": labels, "lora_path": "a3"}
    answer = requests.post(
        f"{lora_server.url}/v1/score", json={**body, "apply_softmax": True}, timeout=120
    )
    assert answer.status_code == 200, answer.text
    assert max_abs_diff(answer.json()["scores"], want) < TOLERANCE
    unloaded = requests.post(
        f"{lora_server.url}/unload_lora_adapter", json={"lora_name": "a3"}, timeout=120
    )
    assert unloaded.status_code == 200, unloaded.text


def test_verify_checks_a_base_with_an_adapter(tiny_llama_path, adapters):
    """`prefillonly verify MODEL --lora ADAPTER`: every probe under the adapter, against
    transformers with it merged: the every-feature variant passes every probe."""
    from prefillonly_sgl.verification.verify import verify

    path, _ = adapters["b"]
    report = verify(
        tiny_llama_path,
        quick=True,
        variants=["all features"],
        lora=str(path),
        progress=lambda line: None,
    )
    assert report.ok and report.lora == str(path), report.table()
    (result,) = report.results
    assert all(check.ok for check in result.checks.values())
    # every probe applies but the images one (a text model)
    assert [name for name, check in result.checks.items() if not check.applies] == ["images"]


def _probabilities(value) -> list[float]:
    """Every "probability" in a decisions answer, in order."""
    if isinstance(value, dict):
        found = [value["probability"]] if "probability" in value else []
        return found + [p for v in value.values() for p in _probabilities(v)]
    if isinstance(value, list):
        return [p for v in value for p in _probabilities(v)]
    return []


def test_decisions_and_rerank_take_the_adapter(lora_server, lora_engine):
    """/v1/decisions with lora_path answers as the Engine does under that adapter (and not
    as the base model); /v1/rerank's scores under lora_path equal those under vLLM's
    `"model": "<adapter>"` and differ from the base model's."""
    from prefillonly_sgl.verification.verify import under_adapter

    state = "Review: terrible side effects, I would not take it again."
    questions = [
        {"type": "predicate", "instructions": "Is the reviewer satisfied?"},
        {
            "type": "choice",
            "instructions": "How does the reviewer feel?",
            "choices": [{"value": "good"}, {"value": "very bad"}],
        },
    ]
    body = {"model": "m", "input": state, "questions": questions}
    url = f"{lora_server.url}/v1/decisions"
    served = requests.post(url, json={**body, "lora_path": "a"}, timeout=120)
    assert served.status_code == 200, served.text
    with under_adapter("a"):
        want = lora_engine.decide(state, questions).model_dump()
    base = lora_engine.decide(state, questions).model_dump()
    got = _probabilities(served.json())
    assert max_abs_diff([got], [_probabilities(want)]) < TOLERANCE
    assert max_abs_diff([got], [_probabilities(base)]) > 100 * TOLERANCE

    rerank = {"query": "history books", "documents": ["a kettle", "a book on Rome", "socks"]}
    url = f"{lora_server.url}/v1/rerank"

    def scores(extra):
        answer = requests.post(url, json={**rerank, **extra}, timeout=120)
        assert answer.status_code == 200, answer.text
        return [
            r["relevance_score"] for r in sorted(answer.json()["results"], key=lambda r: r["index"])
        ]

    adapted = scores({"lora_path": "a"})
    assert max_abs_diff([adapted], [scores({"model": "a"})]) < TOLERANCE
    plain = scores({})
    # the tiny model's relevance scores are ~1e-3: the adapter moves them by a third or more
    assert max_abs_diff([adapted], [plain]) > 0.3 * max(plain)


class Mood(BaseModel):
    satisfied: bool = Field(description="Is the reviewer satisfied?")
    feeling: Literal["good", "very bad"] = Field(description="How does the reviewer feel?")


# (module level: the DSL resolves a function's annotations where it is defined)
@prefillonly.ranker(method="likelihood", item="text", lora_path="b")
def answer_likely(query: str, text: str) -> Prompt:
    return Prompt(prefix="Answer questions.\n", item=f"Text: {text}\nQ:", continuation=query)


@prefillonly.decision(lora_path="a")
def mood(review: str) -> Mood:
    return f"Review: {review}"


def test_likelihood_rankers_and_decisions_bound_to_an_adapter(
    lora_engine, adapters, tiny_llama_path
):
    """The adapter reaches every DSL call (issue 84): a likelihood ranker declared with
    lora_path scores its continuations under it (each token's logprob within 1e-4 of
    transformers with the adapter merged, and not the base model's), and a decision
    function declared with lora_path answers as Engine.decide(..., lora_path=) does."""
    texts = ["a kettle", "a book on Rome"]
    ranking = answer_likely(" history books", items=texts, engine=lora_engine)
    rows = [r.token_logprobs for r in ranking.by_input]
    prompts = [f"Text: {t}\nQ:" for t in texts]
    merged, base = adapters["b"][1], TransformersReference(str(tiny_llama_path))
    want = merged.continuation_logprobs("Answer questions.\n", prompts, " history books")
    assert max_abs_diff(rows, want) < TOLERANCE
    unbound = base.continuation_logprobs("Answer questions.\n", prompts, " history books")
    assert max_abs_diff(rows, unbound) > 100 * TOLERANCE

    review = "terrible side effects, I would not take it again."
    decided = mood(review, engine=lora_engine)
    questions = [
        {"type": "predicate", "instructions": "Is the reviewer satisfied?"},
        {
            "type": "choice",
            "instructions": "How does the reviewer feel?",
            "choices": [{"value": "good"}, {"value": "very bad"}],
        },
    ]
    under_a = lora_engine.decide(f"Review: {review}", questions, lora_path="a").model_dump()
    plain = lora_engine.decide(f"Review: {review}", questions).model_dump()
    # the wire's predicate answers p(yes) alone; a bool field's probabilities hold both
    answers = decided.answers
    got = [[answers["satisfied"].probabilities[True], *answers["feeling"].probabilities.values()]]
    assert max_abs_diff(got, [_probabilities(under_a)]) < TOLERANCE
    assert max_abs_diff(got, [_probabilities(plain)]) > 100 * TOLERANCE
