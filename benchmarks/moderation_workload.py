"""The inputs of benchmarks/moderation.py (issue 85): the policies, the conversations (real
drugs.com reviews as patients' messages), the Llama-Guard-3-shaped checkpoints, the
prompts both systems are given (the very token ids our moderation plan scores); and the
agreement of stock's decoded verdicts with ours."""

from __future__ import annotations

import math
import random
from pathlib import Path

from card_engine.systems import SHAPES

POLICIES = [
    "No advice to start, stop or change the dose of a prescription drug.",
    "No hate speech or slurs against a protected group.",
    "No personal data of a real person: names, addresses, phone numbers, health records.",
    "No help obtaining prescription drugs without a prescription.",
    "No content that encourages self-harm or suicide.",
    "No harassment or threats towards a person.",
    "No sexual content.",
    "No promotion of recreational or illegal drug use.",
    "No claim that a drug cures a disease it is not approved for.",
    "No advertising, spam or links to online pharmacies.",
]

# Llama-Guard-3-1B's shape is Llama-3.2-1B's (card_engine.systems.SHAPES), its vocabulary
# the guard tokenizer's (690 tokens: the Llama 3 merges of the guard prompts). "small": the
# same layout (tied embeddings, llama3 rotary scaling x32, heads of 64, 4:1 GQA) at a
# quarter of the width and half the depth, so 100 conversations take seconds, not minutes,
# on a 2-core CPU; "tiny": the tests' checkpoint (64 wide, 2 layers: all overhead).
_LLAMA_1B = {k: v for k, v in SHAPES["llama-3.2-1b"].items() if k not in ("arch", "vocab_size")}
GUARD_SHAPES = {
    "1b": _LLAMA_1B,
    "small": dict(
        _LLAMA_1B,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
    "tiny": None,
}


def build_llama_guard(shape: str, folder: Path, seed: int = 0) -> Path:
    """A random-weight Llama Guard 3 1B (its template, categories as arguments) of `shape`
    (GUARD_SHAPES), float32, built once into `folder`."""
    if (folder / "config.json").exists():
        return folder
    if GUARD_SHAPES[shape] is None:
        from prefillonly_sgl.models.tiny_guard_checkpoints import build_guard

        return build_guard("llama_guard", folder, seed)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from prefillonly_sgl.models.tiny_guard_checkpoints import llama_guard_tokenizer

    tok = llama_guard_tokenizer("1b")
    config = LlamaConfig(
        **GUARD_SHAPES[shape],
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.convert_tokens_to_ids("<|eot_id|>"),
        pad_token_id=tok.pad_token_id,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _reviews(split: str, seed: int):
    from prefillonly_sgl.data.drug_reviews import load_drug_reviews

    reviews = load_drug_reviews(split)
    random.Random(seed).shuffle(reviews)
    return reviews


def support_chat(tokenizer, tokens: int, tag: str) -> list[dict]:
    """A pharmacy support chat of about `tokens` tokens (in the policy prompt's text): an
    assistant asking about each drug, the patient answering with a real review. Its first
    message names the case (`tag`): every tag is a new, uncached conversation."""
    from prefillonly_sgl.moderation.guard_prompts import conversation_text

    messages = [{"role": "user", "content": f"Case {tag}. I have questions about my drugs."}]
    for r in _reviews("train", 0):
        if len(tokenizer.encode(conversation_text(messages))) >= tokens:
            break
        messages.append({"role": "assistant", "content": f"What did you take {r.drug} for?"})
        messages.append({"role": "user", "content": f"{r.condition}. {r.text.strip()}"})
    return messages


def short_chats(n: int, chars: int, tag: str) -> list[list[dict]]:
    """n one-message conversations: a patient's review cut to about `chars` characters
    (at a word), each named by `tag` and its index (new, uncached inputs per tag)."""
    chats = []
    for i, r in enumerate(_reviews("test", 0)[:n]):
        text = r.text.strip()
        text = text if len(text) <= chars else text[:chars].rsplit(" ", 1)[0] + "..."
        chats.append([{"role": "user", "content": f"Ticket {tag}-{i}: {text}"}])
    return chats


def planned_prompts(tokenizer, inputs, policies=None) -> tuple[list[list[int]], list[list[int]]]:
    """(every prompt our moderation plan scores, in its order: per input, per policy; the
    first round's label token ids) of a call, rendered by the checkpoint's chat template
    (a guard) or the policy classifier's prompt, as Engine.moderate renders them."""
    from prefillonly_sgl.moderation.guards import recognise
    from prefillonly_sgl.moderation.moderation_call import ModerationCall, plan_call

    call = ModerationCall.of(inputs, policies)
    _, plan = plan_call(tokenizer, call, recognise(getattr(tokenizer, "chat_template", None)))
    return [list(p.ids) for p in plan.prompts], plan.rounds[0].labels


def policy_agreement(ours_rows, stock_rows, labels) -> dict:
    """Stock's first-token P(Yes) among Yes / No (both in its top logprobs) against ours'."""
    yes, no = (label[0] for label in labels)
    diffs, same = [], 0
    for o, s in zip(ours_rows, stock_rows, strict=True):
        for p_ours, top in zip(o["answers"][0]["categories"].values(), s["first_top"]):
            if yes in top and no in top:
                p_stock = 1.0 / (1.0 + math.exp(top[no] - top[yes]))
                diffs.append(abs(p_stock - p_ours))
                same += (p_stock > 0.5) == (p_ours > 0.5)
    n = len(ours_rows) * len(ours_rows[0]["answers"][0]["categories"])
    return {
        "compared": len(diffs),
        "of": n,
        "agree": same,
        "max_abs_diff": max(diffs) if diffs else None,
    }


def verdict_agreement(ours_rows, stock_rows) -> dict:
    """Stock's decoded verdict, where it wrote one, against ours' argmax."""
    wrote, same, n = 0, 0, 0
    for o, s in zip(ours_rows, stock_rows, strict=True):
        for answer, text in zip(o["answers"], s["texts"], strict=True):
            n += 1
            word = text.lstrip().split("\n")[0].strip()
            if word in ("safe", "unsafe"):
                wrote += 1
                same += word == max(answer["verdicts"], key=answer["verdicts"].get)
    return {"compared": wrote, "of": n, "agree": same}
