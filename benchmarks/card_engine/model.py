"""The random-weight model of a published shape, and its float32 transformers references."""

from __future__ import annotations

from pathlib import Path

from card_engine.systems import SHAPES


def build_model(shape_name: str, folder: Path, device: str, dtype: str, seed: int = 0) -> Path:
    """A random-weight model of the shape (transformers' own init), with the tiny models'
    tokenizer (prompts are token ids; only its special tokens are read)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from prefillonly_sgl.models.tiny import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    shape = dict(SHAPES[shape_name])
    arch = shape.pop("arch")
    tokenizer = build_tokenizer()
    config_class, model_class = (
        (Qwen3Config, Qwen3ForCausalLM) if arch == "qwen3" else (LlamaConfig, LlamaForCausalLM)
    )
    config = config_class(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype=dtype,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = model_class(config).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return folder


def tokenizer_size(folder: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder))


def reference_logprobs(folder: Path, cases, labels: list[int], device: str, mis: bool = False):
    """The labels' log-probabilities over the whole vocabulary at each case's last position:
    a float32 transformers forward of the same weights on the same device (no cache, one
    prompt at a time; prefillonly_sgl/verification/reference.py). mis: of the sequence SGLang's
    multi-item scoring scores for a query and one item instead (see mis_prompt)."""
    import torch

    from prefillonly_sgl.verification.reference import TransformersReference

    reference = TransformersReference(folder, "float32", device)
    rows = {}
    for name, query, item in cases:
        if mis:
            ids, positions = mis_prompt(query, item)
            with torch.no_grad():
                logits = reference.model(
                    input_ids=reference._ids(ids),
                    position_ids=reference._ids(positions),
                    logits_to_keep=1,
                ).logits[0, -1]
            logprobs = torch.log_softmax(logits.double().cpu(), dim=-1)
        else:
            logprobs = reference.next_token_logprobs(query + item)
        rows[name] = logprobs[labels].tolist()
    del reference
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def mis_prompt(query: list[int], item: list[int]) -> tuple[list[int], list[int]]:
    """What SGLang 0.5.23's multi-item scoring computes for one item, up to the position
    its score is read at (the item's last token; the closing delimiter comes after it):
    the query, the delimiter, the item (TokenizerManagerScoreMixin.
    _build_multi_item_token_sequence), at the positions FlashInferAttnBackend.
    _process_multi_item_scoring gives them: the query 0..q-1, the delimiter q-1, the item
    q.. (as if it followed the query). With one item the item-aware mask is causal, so a
    plain forward with these position ids is the reference."""
    from sglang.srt.constants import MIS_DELIMITER_TOKEN_ID

    q = len(query)
    ids = list(query) + [MIS_DELIMITER_TOKEN_ID] + list(item)
    positions = list(range(q)) + [q - 1] + list(range(q, q + len(item)))
    return ids, positions
