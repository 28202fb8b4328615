"""Tiny random-weight decision checkpoints, in the formats SGLang 0.5.23 serves on
/v1/systemone (besides a plain LM, which answers through its own LM head).

- decider / decider_noncausal: a bare Qwen3.5 backbone (architectures ["Qwen3_5Model"],
  no LM head) with decision_config.json and readout.safetensors, the readout rows of its
  answer codes; SGLang places them in the LM head rows of the codes' token ids.
- clef: Qwen3.5 ConditionalGeneration with joint_head_config.json and
  joint_head.safetensors, a joint schema head scoring every option of every question.
- kev: a bare Qwen3.5 text backbone (architectures ["Qwen3_5TextModel"], no LM head)
  with head.pt, a pointer head scoring each option of one question per prompt.

The backbones are models/families.py's tiny Qwen3.5 (64 wide, 3 linear : 1 full attention
layers; 8 layers for the deciders, 4 otherwise), float32, seeded: a folder built twice
is identical. The two deciders share their weights and differ in attention mode only.

Stock SGLang serves each on this CPU install (its .pth boot) with
``python -m sglang.launch_server --model-path DIR --device cpu --dtype float32
--attention-backend torch_native --mamba-radix-cache-strategy no_buffer
--disable-overlap-schedule``: the hybrid backbone's default mamba cache (extra_buffer) is
GPU-only, and no_buffer needs the overlapped scheduler off; Clef's head also needs the
CPU kernel cpu_support/sglang_patches.py gives aten._flash_attention_forward.

    python -m prefillonly_sgl.models.tiny_decision_checkpoints /tmp/tiny-kev --kind kev
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from prefillonly_sgl.models.tiny_checkpoint_saving import save_checkpoint, widen
from prefillonly_sgl.models.tiny_family_checkpoints import (
    _qwen3_5_text,
    _qwen3_5_vl_config,
    _save_vl_processors,
)

KINDS = ("decider", "decider_noncausal", "clef", "kev")

# Answer codes of a decider: yes/no reads codes[0] and codes[1], a choice or score
# question of n options codes[:n] (sglang entrypoints/systemone/serving.py,
# _decider_question), so ten codes serve up to ten options.
DECIDER_CODES = [chr(ord("A") + i) for i in range(10)]
# The delimiters Kev's prompt is built from (entrypoints/systemone/kev.py): state,
# question, option, option end, decide. Rare Qwen tokens, special in Qwen's tokenizer.
KEV_DELIMITERS = [
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|fim_suffix|>",
]
# Clef's prompt closes an empty reasoning block; added (not special) tokens in Qwen's.
THINK_TOKENS = ["<think>", "</think>"]
# The joint schema head, small; JointSchemaHead's constructor takes these and hidden_size.
JOINT_HEAD_SIZES = dict(width=32, routing_layers=1, layers=1, heads=2, feedforward=64)


def _tokenizer_and_sizes() -> tuple[object, dict]:
    """models/families.py's Qwen3.5 tokenizer and text sizes, plus the tokens the decision
    prompts use, so each is one id as in Qwen's tokenizer (one tokenizer for every kind,
    as every published Qwen3.5 tokenizer has them all)."""
    tok, sizes = _qwen3_5_text(moe=False)
    tok.add_tokens(KEV_DELIMITERS, special_tokens=True)
    tok.add_tokens(THINK_TOKENS)
    sizes["vocab_size"] = len(tok)
    return tok, sizes


def _generator(seed: int, salt: int):
    import torch

    return torch.Generator().manual_seed(seed * 1000 + salt)


def _write_index(out: Path) -> None:
    """The published checkpoints are sharded, with an index naming the model's files.
    SGLang reads only the files it names when there is one; without it, it would also
    read readout.safetensors / joint_head.safetensors as model weights (and warn that
    their names are not parameters)."""
    from safetensors import safe_open

    shard = out / "model.safetensors"
    with safe_open(shard, "pt") as f:
        keys = sorted(f.keys())
    index = {
        "metadata": {"total_size": shard.stat().st_size},
        "weight_map": {key: shard.name for key in keys},
    }
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _decider(out_dir, seed: int, attention_mode: str) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5Model

    tok, sizes = _tokenizer_and_sizes()
    # Two rounds of 3 linear : 1 full. With one full-attention layer, the last, the
    # readout's last position sees the same in both attention modes; a full layer with
    # layers after it makes noncausal attention change the answers.
    sizes.update(num_hidden_layers=8, layer_types=sizes["layer_types"] * 2)
    token_ids = []
    for code in DECIDER_CODES:
        # SGLang checks each code is one token after the chat prompt (ending in "\n").
        ids = tok.encode("\n" + code, add_special_tokens=False)
        if ids[:-1] != tok.encode("\n", add_special_tokens=False):
            raise RuntimeError(f"decider code {code!r} is not one token after a newline")
        token_ids.append(ids[-1])
    torch.manual_seed(seed)
    # The bare backbone (no LM head): its weights save as language_model.* / visual.*.
    out = save_checkpoint(Qwen3_5Model(_qwen3_5_vl_config(tok, sizes)), tok, out_dir, seed)
    # Served as Qwen3_5ForConditionalGeneration, a multimodal class: processors needed.
    _save_vl_processors(out)
    _write_index(out)
    config = {
        "format_version": 1,
        "codes": DECIDER_CODES,
        "token_ids": token_ids,
        "temperature": 1.7,
        "attention_mode": attention_mode,
        "pooling": "last",
    }
    (out / "decision_config.json").write_text(json.dumps(config, indent=2) + "\n")
    readout = torch.randn(len(DECIDER_CODES), sizes["hidden_size"], generator=_generator(seed, 1))
    save_file({"weight": readout * 0.2}, out / "readout.safetensors", {"format": "pt"})
    return out


def _clef(out_dir, seed: int) -> Path:
    import torch
    from safetensors.torch import save_file
    from sglang.srt.layers.joint_schema_head import JointSchemaHead
    from transformers import Qwen3_5ForConditionalGeneration

    tok, sizes = _tokenizer_and_sizes()
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(_qwen3_5_vl_config(tok, sizes))
    out = save_checkpoint(model, tok, out_dir, seed)
    _save_vl_processors(out)
    _write_index(out)
    head_config = {"hidden_size": sizes["hidden_size"], **JOINT_HEAD_SIZES}
    (out / "joint_head_config.json").write_text(json.dumps(head_config, indent=2) + "\n")
    torch.manual_seed(seed + 2)
    head = JointSchemaHead(**head_config)
    widen(head, seed + 2)
    with torch.no_grad():
        # Zero by default: the prior would weigh nothing and the sigmoid gate sit at
        # 0.5 on an unscaled cosine; non-zero values make every term of the logit count.
        head.prior_logit_scale.fill_(math.log(4.0))
        head.joint_logit_scale.fill_(math.log(8.0))
        head.residual_gate.fill_(1.0)
    state = {k: v.contiguous() for k, v in head.state_dict().items()}
    save_file(state, out / "joint_head.safetensors", {"format": "pt"})
    return out


def _kev(out_dir, seed: int) -> Path:
    import torch
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    tok, sizes = _tokenizer_and_sizes()
    torch.manual_seed(seed)
    # The bare text backbone: weights under its own names (embed_tokens.*, layers.*,
    # norm.*), which SGLang's Kev loader (models/qwen3_5_text.py) hands to the body as
    # they are; a "model."-prefixed name would not load.
    out = save_checkpoint(Qwen3_5TextModel(Qwen3_5TextConfig(**sizes)), tok, out_dir, seed)
    write_pointer_head(out, sizes["hidden_size"], head_dim=16, seed=seed)
    return out


def write_pointer_head(out: Path, hidden: int, head_dim: int, seed: int = 0) -> Path:
    """Kev's head.pt beside a backbone of width `hidden`: the fields SGLang's
    load_pointer_head reads (configs/model_config.py), random seeded q / k projections;
    the two prompt options Kev can train with are off, since SGLang refuses them."""
    import torch

    g = _generator(seed, 3)
    head = {
        "q.weight": torch.randn(head_dim, hidden, generator=g) * 0.1,
        "q.bias": torch.randn(head_dim, generator=g) * 0.1,
        "k.weight": torch.randn(head_dim, hidden, generator=g) * 0.1,
        "k.bias": torch.randn(head_dim, generator=g) * 0.1,
    }
    meta = {
        "head": head,
        "head_dim": head_dim,
        "temperature": 0.8,
        "weights_dtype": "fp32",
        "base_revision": None,
        "option_isolation": False,
        "special_embeddings": False,
    }
    torch.save(meta, out / "head.pt")
    return out / "head.pt"


def decision_tokenizer():
    """The tokenizer every kind here uses (the tiny Qwen3.5 one with the decision prompts'
    tokens), for a benchmark's larger backbone."""
    return _tokenizer_and_sizes()[0]


def build_decision_checkpoint(kind: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny decision checkpoint of `kind` (one of KINDS) to out_dir; returns it."""
    if kind == "decider":
        return _decider(out_dir, seed, "causal")
    if kind == "decider_noncausal":
        return _decider(out_dir, seed, "noncausal_full_attention")
    if kind == "clef":
        return _clef(out_dir, seed)
    if kind == "kev":
        return _kev(out_dir, seed)
    raise ValueError(f"unknown kind {kind!r}: expected one of {', '.join(KINDS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_decision_checkpoint(args.kind, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
