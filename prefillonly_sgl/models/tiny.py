"""Tiny random-weight Llama / Qwen2 folders, built on the fly for fast tests and demos.

The tokenizer is a byte-level BPE trained locally on a small built-in corpus, so no hub
access is needed; common words used by tests and examples (" Yes", " No", " good",
" bad", " positive", " negative", the digits) are single tokens. Weights are random but
seeded, so a folder built twice is identical.

    python -m prefillonly_sgl.models.tiny /tmp/tiny-llama --arch llama
"""

from __future__ import annotations

import argparse
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Words that must be single tokens (with and without the leading space).
LABEL_WORDS = [
    "Yes",
    "No",
    "yes",
    "no",
    "good",
    "bad",
    "positive",
    "negative",
    "neutral",
    "A",
    "B",
    "C",
]
_CORPUS = [
    "The applicant has a stable job and pays every bill on time.",
    "Review: this medicine worked well and I feel much better now.",
    "Review: terrible side effects, I would not take it again.",
    "User profile: likes science fiction, history books and long walks.",
    "Item: a documentary about the history of the moon landing.",
    "Question: is this item relevant to the user? Answer Yes or No.",
    "Credit history: two loans, one late payment, savings account, owns a house.",
    "Sentiment: positive. Sentiment: negative. Sentiment: neutral.",
    "Rating from 1 to 5: 1 2 3 4 5 6 7 8 9 0",
]


def build_tokenizer(vocab_size: int = 400):
    """A PreTrainedTokenizerFast with a ChatML template, trained here in ~0.1 s."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    words = [w for w in LABEL_WORDS] + [" " + w for w in LABEL_WORDS]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating the label words makes BPE merge each of them into one token.
    tok.train_from_iterator(_CORPUS * 4 + words * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    for word in words:
        ids = fast.encode(word, add_special_tokens=False)
        if len(ids) != 1:
            raise RuntimeError(f"tiny tokenizer: {word!r} is not one token: {ids}")
    return fast


def common_sizes(tokenizer) -> dict:
    """The sizes every tiny model shares (models/tiny_family_checkpoints.py's too): 64
    wide, 2 layers, 4 query heads of 16, 2 KV heads (GQA), untied embeddings."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


# FlashInfer's smallest head_dim is 64 (16 stops its prefill): a card's tiny checkpoints
CARD_SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4)


def build_tiny_model(out_dir: str | Path, arch: str = "llama", seed: int = 0, **sizes) -> Path:
    """Write a random-weight model folder (config, safetensors, tokenizer); returns it.
    sizes: config fields instead of common_sizes' (CARD_SIZES for FlashInfer)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tokenizer = build_tokenizer()
    common = dict(**{**common_sizes(tokenizer), **sizes}, torch_dtype="float32")
    if arch == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch!r}: expected 'llama' or 'qwen2'")
    torch.manual_seed(seed)
    model = cls(config)
    # Random init is tiny (std 0.02): widen it so label probabilities differ visibly and a
    # wrong attention mask or position shows up as a large error in parity tests.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=["llama", "qwen2"], default="llama")
    args = parser.parse_args()
    print(build_tiny_model(args.out_dir, args.arch))


if __name__ == "__main__":
    main()
