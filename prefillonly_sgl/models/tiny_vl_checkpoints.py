"""Tiny vision-language checkpoints in their published shapes (Qwen2.5-VL, Qwen3-VL), built
on the fly for the image tests (tiny_family_checkpoints.FAMILY_BUILDERS names them): the
tiny ChatML tokenizer with the vision markers as special tokens, transformers' config and
model classes with the towers scaled down and their structure kept, the published
processors and chat templates. `qwen2_5_vl_parts` / `qwen3_vl_parts` give the tokenizer
and config at other sizes (the benchmarks' larger model)."""

from __future__ import annotations

from pathlib import Path

from prefillonly_sgl.models.tiny import build_tokenizer
from prefillonly_sgl.models.tiny_checkpoint_saving import common_fields, save_checkpoint

# Qwen3.5's vision markers; the published tokenizer has them as special tokens, and the
# ConditionalGeneration config points at them, so the tiny tokenizer gets them too
# (outside the text, they are never in a text-only prompt).
QWEN_VISION_TOKENS = [
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]


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
    text = {**common_fields(tok), **(text_sizes or {})}
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
    tok.add_special_tokens({"additional_special_tokens": QWEN_VISION_TOKENS})
    tok.chat_template = chat_template
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN_VISION_TOKENS}
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


def build_qwen2_5_vl(out_dir, seed: int = 0) -> Path:
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
    out = save_checkpoint(Qwen2_5_VLForConditionalGeneration(config), tok, out_dir, seed)
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
    text = {
        **common_fields(tok),
        "num_hidden_layers": 4,
        "head_dim": 32,
        "tie_word_embeddings": True,
    }
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


def build_qwen3_vl(out_dir, seed: int = 0) -> Path:
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
    out = save_checkpoint(Qwen3VLForConditionalGeneration(config), tok, out_dir, seed)
    save_qwen3_vl_processor(tok, out)
    return out
