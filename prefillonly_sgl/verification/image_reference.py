"""The independent reference for scoring with images: a plain transformers forward of a
vision-language model on its own processor's inputs (AutoProcessor: the prompt's text
with its image placeholders, and the images), the labels' probabilities at the last
position. What the engine's image scoring is held to (tests/test_images_engine.py).

    reference = ImageReference(model_path)
    reference.label_probabilities(prompt_text, [png_bytes], [yes_id, no_id])
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from functools import cached_property


class ImageReference:
    def __init__(self, model_path: str, dtype: str = "float32") -> None:
        self.model_path = str(model_path)
        self.dtype = dtype

    @cached_property
    def processor(self):
        from transformers import AutoProcessor

        return AutoProcessor.from_pretrained(self.model_path)

    @cached_property
    def model(self):
        import torch
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(
            self.model_path, dtype=getattr(torch, self.dtype)
        )
        return model.eval()

    def inputs(self, prompt: str, images: Sequence[bytes]):
        """The processor's tensors for one prompt (its placeholders expanded)."""
        from PIL import Image

        pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
        return self.processor(text=[prompt], images=pil or None, return_tensors="pt")

    def expanded_length(self, prompt: str, images: Sequence[bytes]) -> int:
        """The prompt's length in tokens with every image expanded."""
        return int(self.inputs(prompt, images)["input_ids"].shape[1])

    def label_probabilities(
        self, prompt: str, images: Sequence[bytes], label_ids: Sequence[int], softmax: bool
    ) -> list[float]:
        """Each label token's probability after the prompt: over the whole vocabulary, or
        normalised over the labels (``softmax``)."""
        import torch

        with torch.no_grad():
            logits = self.model(**self.inputs(prompt, images)).logits[0, -1].double()
        if softmax:
            return torch.softmax(logits[list(label_ids)], -1).tolist()
        return torch.softmax(logits, -1)[list(label_ids)].tolist()

    def sequence_logprobs(
        self, prompt: str, images: Sequence[bytes], sequences: Sequence[Sequence[int]]
    ) -> list[float]:
        """Each label's log-probability after the prompt, its tokens by the chain rule:
        one forward of the prompt's processed ids then the label's tokens (all but the
        last) per label, its tokens' log-probabilities summed."""
        import torch

        inputs = self.inputs(prompt, images)
        n = inputs["input_ids"].shape[1]
        # the per-token inputs (ids, attention mask, the processor's token types) grow by
        # the label's tokens: text tokens, attended
        per_token = [k for k, v in inputs.items() if v.dim() == 2 and v.shape == (1, n)]
        out = []
        with torch.no_grad():
            for label in sequences:
                more = torch.tensor([list(label[:-1])], dtype=inputs["input_ids"].dtype)
                grown = {
                    "input_ids": more,
                    "attention_mask": torch.ones_like(more),
                }
                fed = dict(inputs)
                for key in per_token:
                    tail = grown.get(key, torch.zeros_like(more))
                    fed[key] = torch.cat([inputs[key], tail.to(inputs[key].dtype)], 1)
                logits = self.model(**fed).logits[0].double()
                logprobs = torch.log_softmax(logits[n - 1 : n - 1 + len(label)], -1)
                out.append(float(sum(logprobs[j, t] for j, t in enumerate(label))))
        return out
