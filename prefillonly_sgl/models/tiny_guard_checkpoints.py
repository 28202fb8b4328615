"""Tiny random-weight guard checkpoints in the published guards' shapes, with their chat
templates, built offline for the moderation tests.

- Llama Guard 3 (`build_llama_guard`): a Llama in Llama-Guard-3-1B's shape (tied embeddings,
  Llama 3 rotary scaling, factor 32) with the 1B's template, which takes `categories` and
  `excluded_category_keys`; variant "8b": Llama-Guard-3-8B's shape (untied, factor 8) and
  its template (S1-S14 written into it). Tokenizer: Llama 3's pre-tokenizer and the real
  Llama 3 merges of the guard prompts and verdicts (guard_tokenizer_merges.py), so
  "\\n\\nunsafe\\nS1,S10" splits as ["\\n\\n", "unsafe", "\\n", "S", "1", ",S", "10"]; a
  leading <|begin_of_text|> is added on encode, as the published tokenizer does.
- Qwen3Guard-Gen (`build_qwen3guard`): a Qwen3 in Qwen3Guard-Gen-0.6B's shape (tied
  embeddings, explicit head_dim) with its template (prompt and response moderation);
  Qwen's pre-tokenizer and real merges: "Safety: Controversial" splits as ["Safety", ":",
  " Cont", "rovers", "ial"].
- Granite Guardian (`build_granite_guardian`): a Granite in granite-guardian-3.1-2b's shape
  (tied, Granite 3.1's multipliers) with the 3.1 template (guardian_config), or "3.0" /
  "3.3-documented". No Granite tokenizer is on PyPI: a byte-level BPE trained here, where
  "Yes", "No", " yes", " no" are single tokens (unverified against Granite's own).

Each tokenizer has the special tokens its template writes. Sizes are the other tiny models'
(64 wide, 2 layers, 4 query heads of 16, 2 KV heads), float32, weights widened to std 0.2,
seeded: a folder built twice is identical. Templates, taxonomies and their sources:
models/guard_templates/ (README.md there).

    python -m prefillonly_sgl.models.tiny_guard_checkpoints /tmp/llama-guard --guard llama_guard
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from prefillonly_sgl.models import guard_templates
from prefillonly_sgl.models.guard_tokenizer_merges import (
    LLAMA3_PATTERN,
    QWEN_PATTERN,
    bytes_to_unicode,
    load_merges,
)
from prefillonly_sgl.models.tiny_checkpoint_saving import common_fields, save_checkpoint

GUARDS = ("llama_guard", "qwen3guard", "granite_guardian")
LLAMA_GUARD_VARIANTS = {"1b": "llama_guard_3_1b.jinja", "8b": "llama_guard_3_8b.jinja"}
GRANITE_GUARDIAN_TEMPLATES = {
    "3.0": "granite_guardian_3_0.jinja",
    "3.1": "granite_guardian_3_1.jinja",
    "3.3-documented": "granite_guardian_3_3.documented.jinja",
}
# The special tokens each family's published tokenizer has and its guard templates write
# (<|image|>: the Llama Guard 3 1B template writes it before an image part).
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
    "<|image|>",
]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_ADDED = ["<think>", "</think>"]  # added, not special, in Qwen3's tokenizer
GRANITE_SPECIALS = ["<|end_of_text|>", "<|start_of_role|>", "<|end_of_role|>", "<|tool_call|>"]
# Granite's trained tokenizer: these are single tokens (the guard's answers).
GRANITE_WORDS = ["Yes", "No", "yes", "no", "High", "Low"]


def _bpe_tokenizer(
    merges: list[str],
    pattern: str,
    specials: list[str],
    added: tuple[str, ...] = (),
    bos_on_encode: str | None = None,
):
    """A byte-level BPE with exactly `merges` (rank order), the family's pre-tokenizer
    pattern, and its special tokens; tiktoken's rule that a piece in the vocabulary is one
    token (ignore_merges)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    pairs = [tuple(m.split(" ")) for m in merges]
    for left, right in pairs:
        vocab.setdefault(left + right, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    if bos_on_encode is not None:
        bos_id = tok.token_to_id(bos_on_encode)
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos_on_encode} $A",
            pair=f"{bos_on_encode} $A {bos_on_encode} $B",
            special_tokens=[(bos_on_encode, bos_id)],
        )
    return tok


def _check_splits(tokenizer, expected: dict[str, list[str]], guard: str) -> None:
    """The verdict lines split as the published tokenizer splits them (the guard's .json)."""
    for text, pieces in expected.items():
        got = [tokenizer.decode([i]) for i in tokenizer.encode(text, add_special_tokens=False)]
        if got != pieces:
            raise RuntimeError(f"tiny {guard} tokenizer splits {text!r} as {got}, not {pieces}")


def llama_guard_tokenizer(variant: str = "1b"):
    """Llama 3's pre-tokenizer and real merges, its special tokens, BOS on encode, and the
    Llama Guard 3 template of `variant` ("1b": categories / excluded_category_keys)."""
    from transformers import PreTrainedTokenizerFast

    template = _variant(LLAMA_GUARD_VARIANTS, variant, "Llama Guard 3 variant")
    tok = _bpe_tokenizer(
        load_merges()["llama3"]["merges"],
        LLAMA3_PATTERN,
        LLAMA3_SPECIALS,
        bos_on_encode="<|begin_of_text|>",
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
    )
    fast.chat_template = guard_templates.template_text(template)
    _check_splits(fast, guard_templates.spec("llama_guard_3")["output"]["llama3_tokens"], "llama")
    return fast


def qwen3guard_tokenizer():
    """Qwen's pre-tokenizer (NFC, single digits) and real merges, ChatML's special tokens,
    <think> / </think> added, and the Qwen3Guard-Gen template."""
    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast

    tok = _bpe_tokenizer(
        load_merges()["qwen"]["merges"], QWEN_PATTERN, QWEN_SPECIALS, added=tuple(QWEN_ADDED)
    )
    tok.normalizer = normalizers.NFC()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = guard_templates.template_text("qwen3guard_gen.jinja")
    _check_splits(fast, guard_templates.spec("qwen3guard_gen")["output"]["qwen_tokens"], "qwen")
    return fast


def granite_guardian_tokenizer(template: str = "3.1", vocab_size: int = 1200):
    """A byte-level BPE trained here on the guardian's own prompts (no Granite tokenizer is
    on PyPI), Granite's special tokens, "Yes" / "No" / " yes" / " no" single tokens, and the
    Granite Guardian template of `template`."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    name = _variant(GRANITE_GUARDIAN_TEMPLATES, template, "Granite Guardian template")
    spec = guard_templates.spec("granite_guardian")
    corpus = [guard_templates.template_text(n) for n in GRANITE_GUARDIAN_TEMPLATES.values()]
    for bank in ("risks_3_0", "risks_3_1", "criteria_3_3"):
        corpus += [str(v) for v in spec[bank].values()]
    words = [w for w in GRANITE_WORDS] + [" " + w for w in GRANITE_WORDS]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in GRANITE_SPECIALS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus * 2 + words * 200, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|end_of_text|>",
        eos_token="<|end_of_text|>",
        pad_token="<|end_of_text|>",
        unk_token="<|end_of_text|>",
    )
    fast.chat_template = guard_templates.template_text(name)
    for word in words:
        if len(fast.encode(word, add_special_tokens=False)) != 1:
            raise RuntimeError(f"tiny Granite Guardian tokenizer: {word!r} is not one token")
    return fast


def _variant(table: dict, key: str, what: str) -> str:
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"unknown {what} {key!r}: expected one of {', '.join(table)}") from None


def build_llama_guard(out_dir: str | Path, seed: int = 0, variant: str = "1b") -> Path:
    """Tiny Llama Guard 3 of `variant`: "1b" (Llama-Guard-3-1B: tied embeddings, llama3
    rotary scaling factor 32, the template with categories / excluded_category_keys) or
    "8b" (Llama-Guard-3-8B: untied, factor 8, S1-S14 in the template)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = llama_guard_tokenizer(variant)
    common = common_fields(tok)
    common.update(
        tie_word_embeddings=variant == "1b",
        max_position_embeddings=131072,
        eos_token_id=tok.convert_tokens_to_ids("<|eot_id|>"),
    )
    rope = {
        "rope_type": "llama3",
        "factor": 32.0 if variant == "1b" else 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
    }
    config = LlamaConfig(**common, rope_theta=500000.0, rope_scaling=rope)
    torch.manual_seed(seed)
    return save_checkpoint(LlamaForCausalLM(config), tok, out_dir, seed)


def build_qwen3guard(out_dir: str | Path, seed: int = 0) -> Path:
    """Tiny Qwen3Guard-Gen (Qwen3Guard-Gen-0.6B's shape: a Qwen3 with tied embeddings and
    an explicit head_dim) with its template."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen3guard_tokenizer()
    common = common_fields(tok)
    common.update(tie_word_embeddings=True, max_position_embeddings=32768)
    config = Qwen3Config(**common, head_dim=16, rope_theta=1000000.0)
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3ForCausalLM(config), tok, out_dir, seed)


def build_granite_guardian(out_dir: str | Path, seed: int = 0, template: str = "3.1") -> Path:
    """Tiny Granite Guardian (granite-guardian-3.1-2b's shape: tied embeddings and Granite
    3.1's multipliers) with the template of `template` ("3.1", "3.0" or "3.3-documented")."""
    import torch
    from transformers import GraniteConfig, GraniteForCausalLM

    tok = granite_guardian_tokenizer(template)
    common = common_fields(tok)
    common.update(tie_word_embeddings=True, max_position_embeddings=131072)
    config = GraniteConfig(
        **common,
        rope_theta=5000000.0,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1.0 / 16,
        logits_scaling=8.0,
    )
    torch.manual_seed(seed)
    return save_checkpoint(GraniteForCausalLM(config), tok, out_dir, seed)


GUARD_BUILDERS: dict[str, Callable[..., Path]] = {
    "llama_guard": build_llama_guard,
    "qwen3guard": build_qwen3guard,
    "granite_guardian": build_granite_guardian,
}


def build_guard(name: str, out_dir: str | Path, seed: int = 0, **options) -> Path:
    """Write the tiny guard `name` (one of GUARDS) to out_dir; options: variant= for
    llama_guard, template= for granite_guardian. Returns the folder."""
    try:
        builder = GUARD_BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown guard {name!r}: expected one of {', '.join(GUARDS)}") from None
    return Path(builder(out_dir, seed, **options))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--guard", choices=GUARDS, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variant", choices=list(LLAMA_GUARD_VARIANTS), help="llama_guard")
    parser.add_argument("--template", choices=list(GRANITE_GUARDIAN_TEMPLATES), help="granite")
    args = parser.parse_args()
    options = {}
    if args.variant:
        options["variant"] = args.variant
    if args.template:
        options["template"] = args.template
    print(build_guard(args.guard, args.out_dir, args.seed, **options))


if __name__ == "__main__":
    main()
