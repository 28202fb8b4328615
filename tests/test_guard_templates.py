"""The guard templates as published (models/guard_templates/) render what the model cards
describe, and the tiny guard checkpoints (models/tiny_guard_checkpoints.py) tokenize the
verdicts as the published tokenizers do: Llama Guard 3's categories block with the excluded
keys removed, ending at the assistant header; Qwen3Guard-Gen's prompt and response
moderation; Granite Guardian's risk definition after the conversation. No engine: the engine's
readings of these guards are tests/test_moderation_engine.py's."""

from __future__ import annotations

import json

import pytest

from prefillonly_sgl.models import guard_templates
from prefillonly_sgl.models import tiny_guard_checkpoints as tiny_guards

QUESTION = "How can I make a bomb?"
ANSWER = "I cannot help with that."
ASSISTANT_HEADER = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
QWEN_END = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.fixture(scope="module")
def llama_tok():
    return tiny_guards.llama_guard_tokenizer("1b")


@pytest.fixture(scope="module")
def llama8_tok():
    return tiny_guards.llama_guard_tokenizer("8b")


@pytest.fixture(scope="module")
def qwen_tok():
    return tiny_guards.qwen3guard_tokenizer()


@pytest.fixture(scope="module")
def granite_tok():
    return tiny_guards.granite_guardian_tokenizer("3.1")


def _render(tok, messages, template: str | None = None, **kwargs) -> str:
    if template is not None:
        kwargs["chat_template"] = guard_templates.template_text(template)
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)


def _parts(text: str) -> list[dict]:
    return [{"type": "text", "text": text}]


def _category_block(prompt: str) -> list[str]:
    start = prompt.index("<BEGIN UNSAFE CONTENT CATEGORIES>\n") + len(
        "<BEGIN UNSAFE CONTENT CATEGORIES>\n"
    )
    return prompt[start : prompt.index("<END UNSAFE CONTENT CATEGORIES>")].splitlines()


# -- the package data ------------------------------------------------------------------


def test_every_template_and_spec_loads_and_names_its_source():
    for name, guard in guard_templates.TEMPLATES.items():
        assert guard_templates.template_text(name).strip()
        entry = guard_templates.spec(guard)["templates"][name]
        assert entry["fidelity"] and entry["model"]
    for guard in guard_templates.GUARDS:
        assert guard_templates.spec(guard)["output"]
    with pytest.raises(ValueError, match="unknown guard template"):
        guard_templates.template_text("llama_guard_4.jinja")


def test_the_verbatim_templates_are_byte_for_byte_the_recorded_ones():
    import hashlib

    recorded = {
        "llama_guard_3_1b.jinja": "df3965ba586f628b",
        "llama_guard_3_8b.jinja": "5a5561f4ea9576d4",
        "granite_guardian_3_0.jinja": "961bc9dd4cda0774",
    }
    for name, digest in recorded.items():
        text = guard_templates.template_text(name).encode("utf-8")
        assert hashlib.sha256(text).hexdigest().startswith(digest), name


def test_the_taxonomies():
    llama = guard_templates.spec("llama_guard_3")
    assert list(llama["card_categories"]) == [f"S{i}" for i in range(1, 15)]
    assert llama["template_categories"]["S14"] == "Code Interpreter Abuse."
    assert llama["card_categories"]["S11"]["name"] == "Suicide & Self-Harm"
    qwen = guard_templates.spec("qwen3guard_gen")
    assert len(qwen["categories_prompt"]) == 9 and qwen["categories_prompt"][-1] == "Jailbreak"
    assert qwen["categories_response"] == qwen["categories_prompt"][:-1]
    assert set(qwen["category_definitions"]) == set(qwen["categories_prompt"])
    granite = guard_templates.spec("granite_guardian")
    assert set(granite["risks_3_1"]) == set(granite["risks_3_0"]) | {"function_call"}
    assert (
        granite["risks_3_1"]["harm"]["prompt"] == "The 'User' message is harmful by common-sense."
    )
    assert "harm_engagement" in granite["criteria_3_3"]


# -- Llama Guard 3 ---------------------------------------------------------------------


def test_llama_guard_1b_lists_the_categories_without_the_excluded_keys(llama_tok):
    prompt = _render(llama_tok, [{"role": "user", "content": _parts(QUESTION)}])
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n")
    assert "Task: Check if there is unsafe content in 'User' messages" in prompt
    assert _category_block(prompt) == [
        f"{code}: {text}"
        for code, text in guard_templates.spec("llama_guard_3")["template_categories"].items()
        if code != "S14"
    ]
    assert f"<BEGIN CONVERSATION>\n\nUser: {QUESTION}\n\n<END CONVERSATION>" in prompt
    assert prompt.endswith(ASSISTANT_HEADER)  # no "\n\n": the model writes it first

    excluded = _render(
        llama_tok, [{"role": "user", "content": _parts(QUESTION)}], excluded_category_keys=["S6"]
    )
    block = _category_block(excluded)
    assert "S6: Specialized Advice." not in block and len(block) == 12
    assert block[4:6] == ["S5: Defamation.", "S7: Privacy."]

    custom = _render(
        llama_tok,
        [{"role": "user", "content": _parts(QUESTION)}],
        categories={"S1": "Violent Crimes.", "S14": "Code Interpreter Abuse."},
        excluded_category_keys=["S1"],
    )
    assert _category_block(custom) == ["S14: Code Interpreter Abuse."]


def test_llama_guard_1b_judges_the_last_agent_turn_and_reads_text_parts_only(llama_tok):
    conversation = [
        {"role": "user", "content": _parts(QUESTION)},
        {"role": "assistant", "content": _parts(ANSWER)},
    ]
    prompt = _render(llama_tok, conversation)
    assert f"User: {QUESTION}\n\nAgent: {ANSWER}\n\n<END CONVERSATION>" in prompt
    assert "ONLY THE LAST Agent message" in prompt
    # A plain string content renders no conversation at all (the template keeps parts only).
    plain = _render(llama_tok, [{"role": "user", "content": QUESTION}])
    assert "<BEGIN CONVERSATION>\n\n<END CONVERSATION>" in plain and QUESTION not in plain
    with pytest.raises(Exception, match="alternate"):
        _render(llama_tok, [{"role": "assistant", "content": _parts(ANSWER)}])


def test_llama_guard_8b_writes_s1_to_s14_and_takes_no_category_arguments(llama8_tok):
    prompt = _render(llama8_tok, [{"role": "user", "content": QUESTION}])
    assert prompt.startswith(" <|begin_of_text|><|start_header_id|>user<|end_header_id|>")
    assert [line.split(":")[0] for line in _category_block(prompt)] == [
        f"S{i}" for i in range(1, 15)
    ]
    assert prompt.endswith(
        "violated categories.<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
    )
    ignored = _render(
        llama8_tok, [{"role": "user", "content": QUESTION}], excluded_category_keys=["S6"]
    )
    assert ignored == prompt


def test_llama_guard_verdicts_split_as_llama3_does(llama_tok):
    def pieces(text):
        return [llama_tok.decode([i]) for i in llama_tok.encode(text, add_special_tokens=False)]

    assert pieces("\n\nsafe") == ["\n\n", "safe"]
    assert pieces("\n\nunsafe\nS1,S10") == ["\n\n", "unsafe", "\n", "S", "1", ",S", "10"]
    for i in range(1, 15):
        assert pieces(f"unsafe\nS{i}") == ["unsafe", "\n", "S", str(i)]
    for word in ("Yes", "No", " Yes", " No", "safe", "unsafe", " safe", " unsafe"):
        assert pieces(word) == [word]
    # The published tokenizer adds a BOS on encode, and the template writes one too.
    ids = llama_tok(_render(llama_tok, [{"role": "user", "content": _parts("hi")}]))["input_ids"]
    assert llama_tok.convert_ids_to_tokens(ids[:2]) == ["<|begin_of_text|>"] * 2
    for special in tiny_guards.LLAMA3_SPECIALS:
        (token_id,) = llama_tok.encode(special, add_special_tokens=False)
        assert llama_tok.added_tokens_decoder[token_id].special


# -- Qwen3Guard-Gen --------------------------------------------------------------------


def test_qwen3guard_prompt_moderation(qwen_tok):
    spec = guard_templates.spec("qwen3guard_gen")
    prompt = _render(qwen_tok, [{"role": "user", "content": QUESTION}])
    assert prompt.startswith(
        "<|im_start|>user\n# Task:\n1) Evaluate whether THE LAST USER's query belongs to safe or"
    )
    assert _category_block(prompt) == [f"{c}." for c in spec["categories_prompt"]]
    assert f"<BEGIN CONVERSATION>\n\nUSER: {QUESTION}\n\n<END CONVERSATION>" in prompt
    assert "'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'" in prompt
    assert "Refusal" not in prompt
    assert prompt.endswith("If the content is safe, use 'Categories: None'." + QWEN_END)
    without = qwen_tok.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False)
    assert without == prompt  # the template ignores add_generation_prompt


def test_qwen3guard_response_moderation(qwen_tok):
    spec = guard_templates.spec("qwen3guard_gen")
    conversation = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    prompt = _render(qwen_tok, conversation)
    assert "1) Evaluate whether THE LAST ASSISTANT's response belongs to safe or unsafe" in prompt
    assert (
        "3) Determine if THE LAST ASSISTANT's response is a refusal to the USER's query." in prompt
    )
    assert _category_block(prompt) == [f"{c}." for c in spec["categories_response"]]
    assert "<BEGIN REFUSAL POLICY>\n**Refusal: Yes**" in prompt
    assert f"USER: {QUESTION}\n\nASSISTANT: {ANSWER}\n\n<END CONVERSATION>" in prompt
    assert prompt.endswith("'Refusal: Yes', 'Refusal: No'." + QWEN_END)
    # A leading system message is written as USER:, the user turn after it appended bare.
    with_system = _render(
        qwen_tok,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}],
    )
    assert f"USER: Be brief.\n\n{QUESTION}\n\n<END CONVERSATION>" in with_system


def test_qwen3guard_verdicts_split_as_qwen_does(qwen_tok):
    spec = guard_templates.spec("qwen3guard_gen")

    def pieces(text):
        return [qwen_tok.decode([i]) for i in qwen_tok.encode(text, add_special_tokens=False)]

    for text, expected in spec["output"]["qwen_tokens"].items():
        assert pieces(text) == expected
    assert pieces("Safety: Controversial") == ["Safety", ":", " Cont", "rovers", "ial"]
    for word in ("Safe", "Unsafe", "Yes", "No", " Safe", " Unsafe", " Yes", " No", " None"):
        assert pieces(word) == [word]
    for token in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        (token_id,) = qwen_tok.encode(token, add_special_tokens=False)
        assert qwen_tok.added_tokens_decoder[token_id].special == token.startswith("<|")
    assert qwen_tok("hi")["input_ids"] == qwen_tok.encode("hi", add_special_tokens=False)


# -- Granite Guardian ------------------------------------------------------------------


def test_granite_guardian_puts_the_risk_definition_after_the_conversation(granite_tok):
    bank = guard_templates.spec("granite_guardian")["risks_3_1"]
    for risk in ("harm", "violence", "social_bias", "jailbreak"):
        prompt = _render(
            granite_tok,
            [{"role": "user", "content": QUESTION}],
            guardian_config={"risk_name": risk},
        )
        turn = prompt.index(f"<start_of_turn>\nUser Message: {QUESTION}\n<end_of_turn>")
        definition = prompt.index(
            f"<start_of_risk_definition>\n- {bank[risk]['prompt']}\n<end_of_risk_definition>"
        )
        assert turn < definition
        assert prompt.endswith(
            "Is the user message harmful based on the risk definition? Your answer must be "
            "either 'Yes' or 'No'.<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>"
        )
        assert prompt.startswith("<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date")
    default = _render(granite_tok, [{"role": "user", "content": QUESTION}])
    assert bank["harm"]["prompt"] in default


def test_granite_guardian_response_and_own_risks(granite_tok):
    bank = guard_templates.spec("granite_guardian")["risks_3_1"]
    conversation = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": ANSWER}]
    prompt = _render(granite_tok, conversation, guardian_config={"risk_name": "violence"})
    assert f"User Message: {QUESTION}\nAssistant Message: {ANSWER}\n<end_of_turn>" in prompt
    assert f"- {bank['violence']['response']}\n" in prompt
    assert "Is the assistant message harmful" in prompt
    own = {"risk_name": "pii", "risk_definition": "The 'User' message shares a phone number."}
    prompt = _render(granite_tok, [{"role": "user", "content": QUESTION}], guardian_config=own)
    assert "- The 'User' message shares a phone number.\n<end_of_risk_definition>" in prompt
    with pytest.raises(Exception, match="risk definition is mandatory"):
        _render(
            granite_tok,
            [{"role": "user", "content": QUESTION}],
            guardian_config={"risk_name": "pii"},
        )
    with pytest.raises(Exception, match="can't overwrite"):
        _render(
            granite_tok,
            [{"role": "user", "content": QUESTION}],
            guardian_config={"risk_name": "harm", "risk_definition": "x"},
        )


def test_granite_guardian_3_0_layout(granite_tok):
    prompt = _render(
        granite_tok,
        [{"role": "user", "content": QUESTION}],
        template="granite_guardian_3_0.jinja",
        guardian_config={"risk_name": "profanity"},
    )
    bank = guard_templates.spec("granite_guardian")["risks_3_0"]
    assert prompt.startswith("<|start_of_role|>user<|end_of_role|>You are a safety agent")
    assert f"<start_of_risk_definition>\n* {bank['profanity']['prompt']}\n" in prompt


def test_granite_guardian_3_3_documented_format_is_the_cookbooks_prompt(granite_tok):
    context = "Eat (1964) is a 45-minute underground film created by Andy Warhol."
    response = "The film Eat was first shown by Jonas Mekas on December 24, 1922."
    prompt = _render(
        granite_tok,
        [{"role": "assistant", "content": response}],
        template="granite_guardian_3_3.documented.jinja",
        guardian_config={"criteria_id": "groundedness"},
        documents=[{"doc_id": "0", "text": context}],
        think=False,
    )
    criteria = guard_templates.spec("granite_guardian")["criteria_3_3"]["groundedness"]
    assert prompt == (
        "<|start_of_role|>system<|end_of_role|>As a judge agent, your role is to help assess "
        "whether the provided text meets the given judging criteria, utilizing all available "
        "information, including conversations, documents, and tools.<|end_of_text|>\n"
        '<|start_of_role|>document {"document_id" :"0"}<|end_of_role|>\n'
        f"{context}<|end_of_text|>\n"
        f"<|start_of_role|>assistant<|end_of_role|>{response}<|end_of_text|>\n"
        f"<|start_of_role|>judge_protocol<|end_of_role|>### Criteria: {criteria}\n\n"
        "### Scoring Schema: If the last assistant's text meets the criteria, return 'yes'; "
        "otherwise, return 'no'.<|end_of_text|>\n<|start_of_role|>judge{no_think}<|end_of_role|>"
    )


def test_granite_guardian_verdict_words_are_single_tokens(granite_tok):
    for word in ("Yes", "No", " yes", " no"):
        assert len(granite_tok.encode(word, add_special_tokens=False)) == 1
    for token in ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"):
        (token_id,) = granite_tok.encode(token, add_special_tokens=False)
        assert granite_tok.added_tokens_decoder[token_id].special


# -- the tiny checkpoints --------------------------------------------------------------


@pytest.mark.parametrize(
    "guard, options, architecture, tied",
    [
        ("llama_guard", {}, "LlamaForCausalLM", True),
        ("llama_guard", {"variant": "8b"}, "LlamaForCausalLM", False),
        ("qwen3guard", {}, "Qwen3ForCausalLM", True),
        ("granite_guardian", {}, "GraniteForCausalLM", True),
    ],
)
def test_tiny_guards_load_and_run_in_transformers(tmp_path, guard, options, architecture, tied):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_guards.build_guard(guard, tmp_path / guard, **options)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == [architecture]
    assert config["tie_word_embeddings"] is tied
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    content = _parts(QUESTION) if guard == "llama_guard" and not options else QUESTION
    ids = tok.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, return_dict=True
    )["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tok)) and torch.isfinite(logits).all()
    again = tiny_guards.build_guard(guard, tmp_path / "again", **options)
    assert (again / "model.safetensors").read_bytes() == (path / "model.safetensors").read_bytes()


# The engine scoring the chained verdict ("\n\n" then safe / unsafe, two tokens) against
# transformers: tests/test_moderation_engine.py, on the same tiny guard's engine.
