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

from prefillonly_sgl.models.tiny import build_tiny_model, build_tokenizer, common_sizes

# Small enough that prompts of ~40 tokens cross the window (tests must exercise it).
SLIDING_WINDOW = 16

# Qwen3.5's vision markers; the published tokenizer has them as special tokens, and the
# ConditionalGeneration config points at them, so the tiny tokenizer gets them too
# (outside the text, they are never in a text-only prompt).
_QWEN3_5_VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


def _common(tokenizer) -> dict:
    """Sizes every family shares: tiny.py's (64 wide, 4 query heads of 16, 2 KV heads)."""
    return common_sizes(tokenizer)


def _widen(model, seed: int) -> None:
    """Random init is tiny (std 0.02): widen matrices (and gpt-oss's sinks) to std 0.2."""
    import torch

    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.endswith(".sinks"):
                # Sinks start at zero; non-zero ones make a backend that ignores them fail.
                p.normal_(0.0, 1.0)


def _save(model, tokenizer, out_dir: str | Path, seed: int) -> Path:
    import torch

    out = Path(out_dir)
    model = model.to(torch.float32)
    _widen(model, seed)
    model.config.dtype = "float32"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _qwen3(out_dir, seed):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    # Published Qwen3 sets head_dim explicitly (128 for hidden 1024..5120); here 16.
    config = Qwen3Config(**_common(tok), head_dim=16)
    torch.manual_seed(seed)
    return _save(Qwen3ForCausalLM(config), tok, out_dir, seed)


def _qwen3_moe(out_dir, seed):
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = build_tokenizer()
    # Qwen3-30B-A3B: every layer sparse, 128 experts top-8, normalised top-k; here 4 top-2.
    config = Qwen3MoeConfig(
        **_common(tok),
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,
    )
    torch.manual_seed(seed)
    return _save(Qwen3MoeForCausalLM(config), tok, out_dir, seed)


def _mistral(out_dir, seed):
    import torch
    from transformers import MistralConfig, MistralForCausalLM

    tok = build_tokenizer()
    # Mistral 7B v0.3 / Nemo publish sliding_window null (full attention).
    config = MistralConfig(**_common(tok), head_dim=16, sliding_window=None)
    torch.manual_seed(seed)
    return _save(MistralForCausalLM(config), tok, out_dir, seed)


def _phi3(out_dir, seed):
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    tok = build_tokenizer()
    # Phi-3.5 / Phi-4-mini: fused qkv and gate_up, GQA, full attention.
    config = Phi3Config(**_common(tok), sliding_window=None)
    torch.manual_seed(seed)
    return _save(Phi3ForCausalLM(config), tok, out_dir, seed)


def _granite(out_dir, seed):
    import torch
    from transformers import GraniteConfig, GraniteForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
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
    return _save(GraniteForCausalLM(config), tok, out_dir, seed)


def _olmo2(out_dir, seed):
    import torch
    from transformers import Olmo2Config, Olmo2ForCausalLM

    tok = build_tokenizer()
    # OLMo 2: norms after attention / MLP and q/k norms over all heads.
    config = Olmo2Config(**_common(tok))
    torch.manual_seed(seed)
    return _save(Olmo2ForCausalLM(config), tok, out_dir, seed)


def _olmo3(out_dir, seed):
    import torch
    from transformers import Olmo3Config, Olmo3ForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
    # OLMo 3 (Olmo-3-7B's shape, scaled down): OLMo 2's layer, 3 sliding : 1 full.
    common.update(num_hidden_layers=4)
    config = Olmo3Config(
        **common,
        sliding_window=SLIDING_WINDOW,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
    )
    torch.manual_seed(seed)
    return _save(Olmo3ForCausalLM(config), tok, out_dir, seed)


def _exaone4(out_dir, seed):
    import torch
    from transformers import Exaone4Config, Exaone4ForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
    # EXAONE 4.0 (the 32B's shape, scaled down): q/k norms, norms after attention / MLP,
    # 3 sliding : 1 full, rotary on the sliding layers only; the pattern as transformers'
    # config class writes it (an integer; the published config.json has "LLLG").
    common.update(num_hidden_layers=4)
    config = Exaone4Config(**common, sliding_window=SLIDING_WINDOW, sliding_window_pattern=4)
    torch.manual_seed(seed)
    return _save(Exaone4ForCausalLM(config), tok, out_dir, seed)


def _lfm2(out_dir, seed):
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
    # LFM2 (LFM2-350M's shape, scaled down): gated short convolutions (kernel 3) with
    # attention layers among them, q / k norms, tied embeddings; its layer layout as
    # transformers' config class writes it (layer_types).
    common.update(num_hidden_layers=6, tie_word_embeddings=True)
    config = Lfm2Config(**common, full_attn_idxs=[2, 5], conv_L_cache=3)
    torch.manual_seed(seed)
    return _save(Lfm2ForCausalLM(config), tok, out_dir, seed)


def _granite_hybrid(out_dir, seed):
    import torch
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
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
    return _save(GraniteMoeHybridForCausalLM(config), tok, out_dir, seed)


def _glm4(out_dir, seed):
    import torch
    from transformers import Glm4Config, Glm4ForCausalLM

    tok = build_tokenizer()
    # GLM-4-0414: qkv bias, half rotary, sandwich norms.
    config = Glm4Config(**_common(tok), head_dim=16, attention_bias=True)
    torch.manual_seed(seed)
    return _save(Glm4ForCausalLM(config), tok, out_dir, seed)


def _gemma3(out_dir, seed):
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = build_tokenizer()
    common = _common(tok)
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
    return _save(Gemma3ForCausalLM(config), tok, out_dir, seed)


def build_gpt_oss(out_dir, seed: int = 0, head_dim: int = 16) -> Path:
    """The tiny gpt-oss; head_dim 16 (the family row's), 64 for a card (FlashInfer's
    smallest: benchmarks/gpu_checks.py)."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    tok = build_tokenizer()
    common = _common(tok)
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
    _widen(model, seed)
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
    model.save_pretrained(out_dir)  # not _save: it would widen (and unround) them again
    tok.save_pretrained(out_dir)
    return Path(out_dir)


def _qwen3_5_text(moe: bool) -> tuple[object, dict]:
    """Qwen3.5 text sizes: 3 linear-attention (gated delta net) : 1 full attention."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": _QWEN3_5_VISION_TOKENS})
    common = _common(tok)
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
    return _save(Qwen3_5ForCausalLM(config), tok, out_dir, seed)


def _qwen3_5_moe(out_dir, seed):
    import torch
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

    tok, sizes = _qwen3_5_text(moe=True)
    # As transformers' config class alone writes it: layer_types, no full_attention_interval
    # (SGLang reads the interval; sglang_runtime/model_configs.py derives it).
    del sizes["full_attention_interval"]
    config = Qwen3_5MoeTextConfig(**sizes)
    torch.manual_seed(seed)
    return _save(Qwen3_5MoeForCausalLM(config), tok, out_dir, seed)


def _qwen3_next(out_dir, seed):
    """Qwen3-Next: Qwen3.5's layer pattern and linear-attention sizes, every MLP a MoE
    with a gated shared expert (Qwen3-Next-80B-A3B's shape, scaled down)."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    tok, sizes = _qwen3_5_text(moe=True)
    config = Qwen3NextConfig(**sizes)
    torch.manual_seed(seed)
    return _save(Qwen3NextForCausalLM(config), tok, out_dir, seed)


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
    ids = {t: tok.convert_tokens_to_ids(t) for t in _QWEN3_5_VISION_TOKENS}
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
    out = _save(Qwen3_5ForConditionalGeneration(config), tok, out_dir, seed)
    _save_vl_processors(out)
    return out


# Qwen2.5-VL's published chat template (Qwen2.5-VL-*-Instruct's chat_template.json): each
# image or video part is written as its vision markers around one pad token, which the
# processor expands to the image's token count.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen2.5-VL's patches as published (14 px, 2 frames, 2x2 merged: one image token covers
# 28x28 pixels): SGLang's Qwen2.5-VL takes pixel rows of any other width than 3*2*14*14 =
# 1176 for precomputed embeddings and skips its vision tower (models/qwen2_5_vl.py,
# get_image_feature), so a smaller patch would never run the tower there.
_QWEN2_5_VL_PATCH = dict(patch_size=14, merge_size=2, temporal_patch_size=2)
# Images of 16 to 1024 tokens (published: min_pixels 56*56 = 4 tokens, max_pixels 16384
# tokens): a 32x32 test image is resized to 112x112 = 4x4 merged tokens, so it crosses the
# tower's windows below, and the cap keeps a stray large image inside a tiny KV pool.
_QWEN2_5_VL_IMAGE_SIZE = {"shortest_edge": 16 * 28 * 28, "longest_edge": 1024 * 28 * 28}
_QWEN2_5_VL_VIDEO_SIZE = {"shortest_edge": 128 * 28 * 28, "longest_edge": 768 * 28 * 28}


_QWEN2_5_VL_TINY_VISION = dict(
    depth=2,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    window_size=56,
    fullatt_block_indexes=[1],
)


def qwen2_5_vl_parts(text_sizes: dict | None = None, vision_sizes: dict | None = None,
                     mrope_section=(2, 3, 3)):  # fmt: skip
    """(tokenizer, config) of a Qwen2.5-VL in the published layout: the ChatML tokenizer
    with the vision markers and the published chat template, a Qwen2 language model with
    M-RoPE behind a vision tower of windowed and full blocks (patch 14, 2x2 merge, as
    SGLang's Qwen2.5-VL requires). text_sizes / vision_sizes replace the tiny sizes
    (benchmarks/images_workload.py builds a larger one); mrope_section: the temporal,
    height and width halves of the rotary dims (sum: head_dim / 2)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLVisionConfig

    tok, marker_ids = _qwen_vl_tokenizer(QWEN2_5_VL_CHAT_TEMPLATE)
    text = {**_common(tok), **(text_sizes or {})}
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    if 2 * sum(mrope_section) != head_dim:
        raise ValueError(
            f"mrope_section {mrope_section} must sum to head_dim / 2 = {head_dim // 2}"
        )
    text.update(
        max_window_layers=text["num_hidden_layers"],  # (no sliding window: unused)
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 1000000.0,
            "mrope_section": list(mrope_section),
        },
    )
    vision = Qwen2_5_VLVisionConfig(
        **(vision_sizes or _QWEN2_5_VL_TINY_VISION),
        patch_size=_QWEN2_5_VL_PATCH["patch_size"],
        spatial_merge_size=_QWEN2_5_VL_PATCH["merge_size"],
        temporal_patch_size=_QWEN2_5_VL_PATCH["temporal_patch_size"],
        out_hidden_size=text["hidden_size"],
        tokens_per_second=2,
    )
    config = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision.to_dict(), **marker_ids, tie_word_embeddings=False
    )
    return tok, config


def save_qwen2_5_vl_processor(tok, out: Path) -> None:
    """The processor AutoProcessor loads (image and video processors, chat template)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor

    processor = Qwen2_5_VLProcessor(
        image_processor=Qwen2VLImageProcessor(**_QWEN2_5_VL_PATCH, size=_QWEN2_5_VL_IMAGE_SIZE),
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(**_QWEN2_5_VL_PATCH, size=_QWEN2_5_VL_VIDEO_SIZE),
        chat_template=QWEN2_5_VL_CHAT_TEMPLATE,
    )
    _save_processor(processor, out)


def _qwen_vl_tokenizer(chat_template: str) -> tuple[object, dict]:
    """(tokenizer, the config's marker ids) of a Qwen vision-language model: the tiny
    ChatML tokenizer with the vision markers as special tokens, as published, and the
    model's chat template."""
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": _QWEN3_5_VISION_TOKENS})
    tok.chat_template = chat_template
    ids = {t: tok.convert_tokens_to_ids(t) for t in _QWEN3_5_VISION_TOKENS}
    return tok, dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )


def _save_processor(processor, out: Path) -> None:
    processor.save_pretrained(out)
    # The published folders also carry them as separate files (preprocessor_config.json,
    # video_preprocessor_config.json), which loaders older than processor_config.json read.
    processor.image_processor.save_pretrained(out)
    processor.video_processor.save_pretrained(out)


def _qwen2_5_vl(out_dir, seed):
    """Qwen2.5-VL as published (qwen2_5_vl_parts), tiny.

    The tower is scaled down with its structure kept: 2 blocks (published 32), the last
    full attention and the other windowed (published [7, 15, 23, 31] full), 32 wide, a
    window of 56 px = 2x2 merged tokens (published 112 px = 4x4), so a 32x32 image (16
    tokens, 4x4) spans 4 windows and the window reordering is exercised. Published:
    head_dim 128 with mrope_section [16, 24, 24]; head_dim 16 here, so [2, 3, 3].
    """
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    tok, config = qwen2_5_vl_parts()
    torch.manual_seed(seed)
    out = _save(Qwen2_5_VLForConditionalGeneration(config), tok, out_dir, seed)
    save_qwen2_5_vl_processor(tok, out)
    return out


# Qwen3-VL-*-Instruct's published chat template (chat_template.json), byte for byte: no
# default system prompt, tools, and each image part written as its vision markers around
# one pad token. Found without the hub: the 5,292-byte template (sha256 3636d0f0...489e4)
# of Qwen3-VL-8B-Instruct's GGUF as a public test pins it (the 2B and 4B publish the same).
QWEN3_VL_CHAT_TEMPLATE_FILE = "qwen3_vl_chat_template.jinja"

# Qwen3-VL's patches as published (16 px, 2 frames, 2x2 merged: one image token covers
# 32x32 pixels). SGLang's Qwen3-VL runs every pixel row through its tower, whatever the
# patch (models/qwen3_vl.py, _get_visual_feature: no width taken for precomputed
# embeddings, unlike its Qwen2.5-VL's 1176), so the published patch runs on a CPU.
_QWEN3_VL_PATCH = dict(patch_size=16, merge_size=2, temporal_patch_size=2)
_QWEN3_VL_NORM = dict(image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])
# Images of 64 tokens at least, as published (65,536 px: a 32x32 test image is resized to
# 256x256 = 8x8 merged tokens, its 16x16 patches across the position table below), capped
# at 1,024 tokens (published 16,384) to keep a stray large image inside a tiny KV pool;
# videos as published.
_QWEN3_VL_IMAGE_SIZE = {"shortest_edge": 64 * 32 * 32, "longest_edge": 1024 * 32 * 32}
_QWEN3_VL_VIDEO_SIZE = {"shortest_edge": 4096, "longest_edge": 25165824}
_QWEN3_VL_VIDEO_SAMPLING = dict(fps=2, min_frames=4, max_frames=768)

_QWEN3_VL_TINY_VISION = dict(
    depth=4,
    hidden_size=32,
    intermediate_size=64,
    num_heads=2,
    deepstack_visual_indexes=[0, 1, 2],
)


def qwen3_vl_chat_template() -> str:
    """The published template, from the package's data (QWEN3_VL_CHAT_TEMPLATE_FILE)."""
    from importlib import resources

    return (
        resources.files("prefillonly_sgl.models")
        .joinpath(QWEN3_VL_CHAT_TEMPLATE_FILE)
        .read_text(encoding="utf-8")
    )


def qwen3_vl_parts(text_sizes: dict | None = None, vision_sizes: dict | None = None,
                   mrope_section=(6, 5, 5)):  # fmt: skip
    """(tokenizer, config) of a dense Qwen3-VL in the published layout (Qwen3-VL-2B/4B-
    Instruct): the ChatML tokenizer with the vision markers and the published chat
    template; a Qwen3 language model (q / k norms, an explicit head_dim) with interleaved
    M-RoPE (mrope_section: the temporal, height and width shares of the rotary pairs,
    summing to head_dim / 2; interleaved, height and width take every third pair) and tied
    embeddings; a vision tower with a learned, interpolated position table, 2x2 patch
    merging and deepstack mergers feeding the first decoder layers. text_sizes /
    vision_sizes replace the tiny sizes."""
    from transformers import Qwen3VLConfig, Qwen3VLVisionConfig

    tok, marker_ids = _qwen_vl_tokenizer(qwen3_vl_chat_template())
    # Published: 2B 2048 wide, 16 heads of 128 (head_dim = hidden / heads); 4B 2560 wide,
    # 32 heads of 128 (head_dim != hidden / heads). Here 64 wide, 4 heads of 32: the 4B's.
    text = {**_common(tok), "num_hidden_layers": 4, "head_dim": 32, "tie_word_embeddings": True}
    text.update(text_sizes or {})
    if 2 * sum(mrope_section) != text["head_dim"]:
        raise ValueError(
            f"mrope_section {mrope_section} must sum to head_dim / 2 = {text['head_dim'] // 2}"
        )
    text.update(
        rms_norm_eps=1e-6,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5000000.0,
            "mrope_section": list(mrope_section),
            "mrope_interleaved": True,
        },
    )
    vision_sizes = vision_sizes or _QWEN3_VL_TINY_VISION
    if len(vision_sizes["deepstack_visual_indexes"]) > text["num_hidden_layers"]:
        raise ValueError("each deepstack merger feeds one decoder layer: too few layers")
    vision = Qwen3VLVisionConfig(
        **vision_sizes,
        hidden_act="gelu_pytorch_tanh",
        in_channels=3,
        patch_size=_QWEN3_VL_PATCH["patch_size"],
        spatial_merge_size=_QWEN3_VL_PATCH["merge_size"],
        temporal_patch_size=_QWEN3_VL_PATCH["temporal_patch_size"],
        out_hidden_size=text["hidden_size"],
        num_position_embeddings=2304,  # published: a 48x48 table, interpolated per image
    )
    config = Qwen3VLConfig(
        text_config=text,
        vision_config=vision.to_dict(),
        **marker_ids,
        tie_word_embeddings=text["tie_word_embeddings"],
    )
    return tok, config


def save_qwen3_vl_processor(tok, out: Path) -> None:
    """The processor AutoProcessor loads (image and video processors, chat template)."""
    from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(
            **_QWEN3_VL_PATCH, **_QWEN3_VL_NORM, size=_QWEN3_VL_IMAGE_SIZE
        ),
        tokenizer=tok,
        video_processor=Qwen3VLVideoProcessor(
            **_QWEN3_VL_PATCH,
            **_QWEN3_VL_NORM,
            **_QWEN3_VL_VIDEO_SAMPLING,
            size=_QWEN3_VL_VIDEO_SIZE,
        ),
        chat_template=tok.chat_template,
    )
    _save_processor(processor, out)


def _qwen3_vl(out_dir, seed):
    """Qwen3-VL as published (qwen3_vl_parts), tiny.

    The tower is scaled down with its structure kept: 4 blocks (published 24), deepstack
    mergers after blocks 0, 1 and 2 (published [5, 11, 17]: three, none after the last)
    added to the outputs of decoder layers 0, 1 and 2, 32 wide, the published 48x48
    position table. Published: head_dim 128 with interleaved mrope_section [24, 20, 20];
    head_dim 32 here, so [6, 5, 5] (the temporal share gets the last pair, as there).
    """
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    tok, config = qwen3_vl_parts()
    torch.manual_seed(seed)
    out = _save(Qwen3VLForConditionalGeneration(config), tok, out_dir, seed)
    save_qwen3_vl_processor(tok, out)
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
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
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
