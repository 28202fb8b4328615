"""Classification heads as their checkpoints are, in every prefillonly process.

SGLang 0.5.23's Qwen2ForSequenceClassification and Qwen3ForSequenceClassification build
their score layer as ``nn.Linear(hidden, num_labels)``: with a bias, which transformers'
classes (and so every checkpoint fine-tuned with them) do not have. Nothing loads it, so
it keeps nn.Linear's random initialisation: stock SGLang's class scores are off by a
random offset that changes from one start to the next (on the tiny Qwen2 head, 4e-3 from
transformers, and ours and stock's apart by as much). Where the checkpoint has no
``score.bias``, the bias is zeroed after loading: the head is then the checkpoint's.
"""

from __future__ import annotations


def _load_without_invented_bias(original, self, weights, *args, **kwargs):
    names: set[str] = set()

    def seen(pairs):
        for name, tensor in pairs:
            names.add(name)
            yield name, tensor

    result = original(self, seen(weights), *args, **kwargs)
    bias = getattr(getattr(self, "score", None), "bias", None)
    if bias is not None and not any(name.endswith("score.bias") for name in names):
        import torch

        with torch.no_grad():
            bias.zero_()
    return result


HOOKS = {
    f"sglang.srt.models.{module}.{cls}.load_weights": ("AROUND", _load_without_invented_bias)
    for module, cls in (
        ("qwen2_classification", "Qwen2ForSequenceClassification"),
        ("qwen3_classification", "Qwen3ForSequenceClassification"),
    )
}
TABLE_NAME = "head_models"
