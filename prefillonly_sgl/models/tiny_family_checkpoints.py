"""Tiny random-weight checkpoints of each model family, built on the fly for parity tests.

Each builder writes a folder (config.json, safetensors, tokenizer) in the shape the
published checkpoints of that family use, only smaller: transformers' own config and
model classes, the project's tiny tokenizer (prefillonly_sgl.models.tiny), seeded weights
widened to std 0.2 so a wrong mask, position or layer kind shows up as a large error, and
float32. A folder built twice is identical. Each build takes about a second.

Published shapes matter: a Gemma 3 with alternating layers and untied embeddings (no
published checkpoint has that shape) scored 0.39 away from transformers in SGLang, the
published 5 sliding : 1 full with tied embeddings 1.5e-7 (shared notes, models-and-data).

    python -m prefillonly_sgl.models.tiny_family_checkpoints /tmp/tiny-gemma3 --family gemma3
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from prefillonly_sgl.models.tiny import build_tiny_model, build_tokenizer
from prefillonly_sgl.models.tiny_checkpoint_saving import common_fields, save_checkpoint, widen
from prefillonly_sgl.models.tiny_vl_checkpoints import (
    QWEN_VISION_TOKENS,
    build_qwen2_5_vl,
    build_qwen3_vl,
)

# Small enough that prompts of ~40 tokens cross the window (tests must exercise it).
SLIDING_WINDOW = 16


def _qwen3(out_dir, seed):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    # Published Qwen3 sets head_dim explicitly (128 for hidden 1024..5120); here 16.
    config = Qwen3Config(**common_fields(tok), head_dim=16)
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3ForCausalLM(config), tok, out_dir, seed)


def _qwen3_moe(out_dir, seed):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = build_tokenizer()
    # Qwen3-30B-A3B: every layer sparse, 128 experts top-8, normalised top-k; here 4 top-2.
    config = Qwen3MoeConfig(
        **common_fields(tok),
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3MoeForCausalLM(config), tok, out_dir, seed)


def _mistral(out_dir, seed):
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    tok = build_tokenizer()
    # Mistral 7B v0.3 / Nemo publish sliding_window null (full attention).
    config = MistralConfig(**common_fields(tok), head_dim=16, sliding_window=None)
    torch.manual_seed(seed)
    return save_checkpoint(MistralForCausalLM(config), tok, out_dir, seed)


def _phi3(out_dir, seed):
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    tok = build_tokenizer()
    # Phi-3.5 / Phi-4-mini: fused qkv and gate_up, GQA, full attention.
    config = Phi3Config(**common_fields(tok), sliding_window=None)
    torch.manual_seed(seed)
    return save_checkpoint(Phi3ForCausalLM(config), tok, out_dir, seed)


def _granite(out_dir, seed):
    import torch
    from transformers import GraniteConfig, GraniteForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # Granite 3.x: tied embeddings and its four multipliers (values of granite-3.1-2b,
    # attention_multiplier = 1/head_dim here as there).
    common["tie_word_embeddings"] = True
    config = GraniteConfig(
        **common,
        embedding_multiplier=12.0,
        residual_multiplier=0.22,
        attention_multiplier=1.0 / 16,
        logits_scaling=8.0,
    )
    torch.manual_seed(seed)
    return save_checkpoint(GraniteForCausalLM(config), tok, out_dir, seed)


def _olmo2(out_dir, seed):
    import torch
    from transformers import Olmo2Config, Olmo2ForCausalLM

    tok = build_tokenizer()
    # OLMo 2: norms after attention / MLP and q/k norms over all heads.
    config = Olmo2Config(**common_fields(tok))
    torch.manual_seed(seed)
    return save_checkpoint(Olmo2ForCausalLM(config), tok, out_dir, seed)


def _olmo3(out_dir, seed):
    import torch
    from transformers import Olmo3Config, Olmo3ForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # OLMo 3 (Olmo-3-7B's shape, scaled down): OLMo 2's layer, 3 sliding : 1 full.
    common.update(num_hidden_layers=4)
    config = Olmo3Config(
        **common,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    )
    torch.manual_seed(seed)
    return save_checkpoint(Olmo3ForCausalLM(config), tok, out_dir, seed)


def _exaone4(out_dir, seed):
    import torch
    from transformers import Exaone4Config, Exaone4ForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # EXAONE 4.0 (the 32B's shape, scaled down): q/k norms, norms after attention / MLP,
    # 3 sliding : 1 full, rotary on the sliding layers only; the pattern as transformers'
    # config class writes it (an integer; the published config.json has "LLLG").
    common.update(num_hidden_layers=4)
    config = Exaone4Config(**common, sliding_window=SLIDING_WINDOW, sliding_window_pattern=4)
    torch.manual_seed(seed)
    return save_checkpoint(Exaone4ForCausalLM(config), tok, out_dir, seed)


def _lfm2(out_dir, seed):
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # LFM2 (LFM2-350M's shape, scaled down): gated short convolutions (kernel 3) with
    # attention layers among them, q / k norms, tied embeddings; its layer layout as
    # transformers' config class writes it (layer_types).
    common.update(num_hidden_layers=6, tie_word_embeddings=True)
    config = Lfm2Config(**common, full_attn_idxs=[2, 5], conv_L_cache=3)
    torch.manual_seed(seed)
    return save_checkpoint(Lfm2ForCausalLM(config), tok, out_dir, seed)


def _granite_hybrid(out_dir, seed):
    import torch
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # Granite 4.0 hybrid (granite-4.0-h-tiny's shape, scaled down): Mamba2 mixers with
    # attention layers among them, no positional embedding ("nope"), routed experts beside
    # a shared MLP, Granite's multipliers; 16-token scan chunks so the probes cross chunks.
    # Its layout as transformers' config class writes it (layer_types). (The dense
    # h-micro shape, num_local_experts=0, scored the same: 7e-7, 2026-11-27.)
    common.update(num_hidden_layers=4)
    linear, full = "linear_attention", "full_attention"
    config = GraniteMoeHybridConfig(
        **common,
        layer_types=[linear, linear, full, linear],
        position_embedding_type="nope",
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=128,
        mamba_n_heads=8,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
        embedding_multiplier=2.0,
        residual_multiplier=0.5,
        attention_multiplier=0.25,
        logits_scaling=2.0,
    )
    torch.manual_seed(seed)
    return save_checkpoint(GraniteMoeHybridForCausalLM(config), tok, out_dir, seed)


def _glm4(out_dir, seed):
    import torch
    from transformers import Glm4Config, Glm4ForCausalLM

    tok = build_tokenizer()
    # GLM-4-0414: qkv bias, half rotary, sandwich norms.
    config = Glm4Config(**common_fields(tok), head_dim=16, attention_bias=True)
    torch.manual_seed(seed)
    return save_checkpoint(Glm4ForCausalLM(config), tok, out_dir, seed)


def _gemma3(out_dir, seed):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = build_tokenizer()
    common = common_fields(tok)
    # The published shape: 5 sliding : 1 full, tied embeddings (see the module docstring).
    common.update(num_hidden_layers=6, tie_word_embeddings=True)
    config = Gemma3TextConfig(
        **common,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
    )
    torch.manual_seed(seed)
    return save_checkpoint(Gemma3ForCausalLM(config), tok, out_dir, seed)


def build_gpt_oss(out_dir, seed: int = 0, head_dim: int = 16) -> Path:
    """The tiny gpt-oss; head_dim 16 (the family row's), 64 for a card (FlashInfer's
    smallest: benchmarks/gpu_checks.py)."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    tok = build_tokenizer()
    common = common_fields(tok)
    # gpt-oss: alternating sliding / full layers, attention sinks, biased attention,
    # MoE in every layer (32 experts top-4 in gpt-oss-20b; here 4 top-2), YaRN rope.
    common.update(intermediate_size=32)
    config = GptOssConfig(
        **common,
        head_dim=head_dim,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(seed)
    model = GptOssForCausalLM(config).to(torch.float32)
    widen(model, seed)
    # SGLang keeps gpt-oss's sinks in bfloat16 whatever the model's dtype (models/
    # gpt_oss.py, except on trtllm_mha): sinks that bfloat16 holds exactly make a float32
    # engine and transformers attend with the same sinks (rounded ones: ~2e-5 apart).
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".sinks"):
                p.copy_(p.to(torch.bfloat16).float())
    model.config.dtype = "float32"
    # The published configs carry swiglu_limit (7.0), which SGLang reads; transformers
    # before 5.19 keeps it out of GptOssConfig (it clamps at 7.0 in the model code), so a
    # checkpoint written there lacked it and SGLang's worker died at start (seen on a card).
    model.config.swiglu_limit = getattr(model.config, "swiglu_limit", 7.0)
    model.save_pretrained(out_dir)  # not save_checkpoint: it would widen (and unround) them again
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def _qwen3_5_text(moe: bool) -> tuple[object, dict]:
    """Qwen3.5 text sizes: 3 linear-attention (gated delta net) : 1 full attention."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": QWEN_VISION_TOKENS})
    common = common_fields(tok)
    common.update(num_hidden_layers=4)
    sizes = dict(
        **common,
        head_dim=16,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        # The published config.json files carry it beside layer_types (Qwen3-Next's
        # name for the 3:1 pattern), and SGLang's Qwen3.5 reads it.
        full_attention_interval=4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
    )
    if moe:
        sizes.pop("intermediate_size")
        sizes.update(
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
        )
    return tok, sizes


def _qwen3_5(out_dir, seed):
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    tok, sizes = _qwen3_5_text(moe=False)
    config = Qwen3_5TextConfig(**sizes)
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3_5ForCausalLM(config), tok, out_dir, seed)


def _qwen3_5_moe(out_dir, seed):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    tok, sizes = _qwen3_5_text(moe=True)
    # As transformers' config class alone writes it: layer_types, no full_attention_interval
    # (SGLang reads the interval; sglang_runtime/model_configs.py derives it).
    del sizes["full_attention_interval"]
    config = Qwen3_5MoeTextConfig(**sizes)
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3_5MoeForCausalLM(config), tok, out_dir, seed)


def _qwen3_next(out_dir, seed):
    """Qwen3-Next: Qwen3.5's layer pattern and linear-attention sizes, every MLP a MoE
    with a gated shared expert (Qwen3-Next-80B-A3B's shape, scaled down)."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    tok, sizes = _qwen3_5_text(moe=True)
    config = Qwen3NextConfig(**sizes)
    torch.manual_seed(seed)
    return save_checkpoint(Qwen3NextForCausalLM(config), tok, out_dir, seed)


def _qwen3_5_vl_config(tok, sizes: dict):
    """Qwen3.5's published config: text sizes beside a (tiny) vision tower, pointing at
    the tokenizer's vision markers."""
    from transformers import Qwen3_5Config, Qwen3_5VisionConfig

    vision = Qwen3_5VisionConfig(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        patch_size=4,
        spatial_merge_size=2,
        temporal_patch_size=2,
        out_hidden_size=sizes["hidden_size"],
        num_position_embeddings=64,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VISION_TOKENS}
    return Qwen3_5Config(
        text_config=sizes,
        vision_config=vision.to_dict(),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )


def _save_vl_processors(out: Path) -> None:
    """The published folders carry the image and video processors' configs; SGLang loads
    the processor of a multimodal architecture at start, text-only requests included."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLVideoProcessor

    sizes = dict(patch_size=4, merge_size=2, temporal_patch_size=2)
    Qwen2VLImageProcessor(**sizes).save_pretrained(out)
    Qwen3VLVideoProcessor(**sizes).save_pretrained(out)


def _qwen3_5_vl(out_dir, seed):
    """The shape Qwen3.5 is published in: ConditionalGeneration with a (tiny) vision tower.

    Used with text input only; the vision weights are there because the published folders
    have them, and a loader must accept (or skip) them.
    """
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    tok, sizes = _qwen3_5_text(moe=False)
    config = _qwen3_5_vl_config(tok, sizes)
    torch.manual_seed(seed)
    out = save_checkpoint(Qwen3_5ForConditionalGeneration(config), tok, out_dir, seed)
    _save_vl_processors(out)
    return out


FAMILY_BUILDERS: dict[str, Callable[[str | Path, int], Path]] = {
    "llama": lambda out, seed: build_tiny_model(out, "llama", seed),
    "qwen2": lambda out, seed: build_tiny_model(out, "qwen2", seed),
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "mistral": _mistral,
    "phi3": _phi3,
    "granite": _granite,
    "olmo2": _olmo2,
    "olmo3": _olmo3,
    "exaone4": _exaone4,
    "lfm2": _lfm2,
    "granite_hybrid": _granite_hybrid,
    "glm4": _glm4,
    "gemma3": _gemma3,
    "gpt_oss": build_gpt_oss,
    "qwen3_5": _qwen3_5,
    "qwen3_5_moe": _qwen3_5_moe,
    "qwen3_next": _qwen3_next,
    "qwen3_5_vl": _qwen3_5_vl,
    "qwen2_5_vl": build_qwen2_5_vl,
    "qwen3_vl": build_qwen3_vl,
}


def build_family(name: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random-weight folder of family `name` to out_dir; returns it."""
    try:
        builder = FAMILY_BUILDERS[name]
    except KeyError:
        raise ValueError(
            f"unknown family {name!r}: expected one of {', '.join(FAMILY_BUILDERS)}"
        ) from None
    return Path(builder(out_dir, seed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--family", choices=list(FAMILY_BUILDERS), required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build_family(args.family, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
