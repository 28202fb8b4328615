"""ScoreOptions: the fields of SGLang 0.5.23's score request that Engine.score passes through
to SGLang as they are (plain Python; checked here so a bad one is refused by name before
anything is sent).

    temperature            the label logits divided by it before the softmax over the labels
                           (calibration); needs apply_softmax, > 0 and finite
    return_token_logprobs  each label's full-vocabulary log-probability beside the scores
                           (uncalibrated: before temperature and the softmax over labels)
    embed_override_token_id, query_embed_overrides, item_embed_overrides
                           SGLang's embedding overrides: at each occurrence of the
                           placeholder token, an embedding vector (a list of hidden-size
                           floats, or a tensor) replaces the token's embedding; the query's
                           occurrences take query_embed_overrides in order, item i's take
                           item_embed_overrides[i] (None: that item has none). SGLang computes
                           such prompts without the prefix cache.
    image_data             per item, the encoded images of its prompt, in placeholder order
                           (a vision-language model; scoring/image_prompts.py places them
                           and checks their placeholders, scoring/images.py loads them)

Labels of several tokens (label_sequences.py: the prompt, then each label prefix as a
cache hit of it) take temperature (the softmax of the labels' sequence log-probabilities
over it) and return_token_logprobs (each label's sequence log-probability), not the
embedding overrides: a refusal says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefillonly_sgl.scoring.errors import InvalidRequestError


@dataclass(frozen=True)
class ScoreOptions:
    temperature: float = 1.0
    return_token_logprobs: bool = False
    embed_override_token_id: int | None = None
    query_embed_overrides: list[Any] | None = None
    item_embed_overrides: list[Any] | None = None
    return_pooled_hidden_states: bool = False  # a classification head's input, per item
    image_data: list[list[bytes]] | None = None  # per item (image_prompts.place_images)

    def check(self, apply_softmax: bool, one_token_labels: bool, n_items: int) -> None:
        """InvalidRequestError naming the first field that cannot be served."""
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            # SGLang's messages, with the value
            raise InvalidRequestError(
                f"temperature must be finite and greater than zero, got {t!r}"
            )
        if t != 1.0 and not apply_softmax:
            raise InvalidRequestError(
                "temperature requires apply_softmax=True (it scales the softmax over the labels)"
            )
        if not isinstance(self.return_token_logprobs, bool):
            raise InvalidRequestError("return_token_logprobs must be true or false")
        overrides = self.query_embed_overrides, self.item_embed_overrides
        if any(o is not None for o in overrides) and self.embed_override_token_id is None:
            raise InvalidRequestError(
                "query_embed_overrides / item_embed_overrides need embed_override_token_id "
                "(the placeholder token they replace)"
            )
        if self.item_embed_overrides is not None and len(self.item_embed_overrides) != n_items:
            raise InvalidRequestError(
                f"item_embed_overrides has {len(self.item_embed_overrides)} entries for "
                f"{n_items} items: give one per item (None for an item without overrides)"
            )
        if self.image_data is not None:
            if len(self.image_data) != n_items:
                raise InvalidRequestError(
                    f"image_data has {len(self.image_data)} entries for {n_items} items"
                )
            if self.embed_override_token_id is not None:
                raise InvalidRequestError("images and embedding overrides cannot be combined")
        if not one_token_labels and self.embed_override_token_id is not None:
            raise InvalidRequestError(
                "embedding overrides apply to labels of one token each: labels of several "
                "tokens are scored through the prefix cache (docs/labels.md), which SGLang "
                "skips for prompts with overrides"
            )

    def sglang_kwargs(self) -> dict[str, Any]:
        """The fields that differ from SGLang's defaults, as score_request's keywords (each
        override vector a float32 tensor, as SGLang's /v1/score handler makes them)."""
        kwargs: dict[str, Any] = {}
        if self.temperature != 1.0:
            kwargs["temperature"] = self.temperature
        if self.return_token_logprobs:
            kwargs["return_token_logprobs"] = True
        if self.embed_override_token_id is not None:
            kwargs["embed_override_token_id"] = self.embed_override_token_id
        if self.return_pooled_hidden_states:
            kwargs["return_pooled_hidden_states"] = True
        if self.query_embed_overrides is not None:
            kwargs["query_embed_overrides"] = _vectors(self.query_embed_overrides)
        if self.image_data is not None:
            kwargs["image_data"] = [list(images) for images in self.image_data]
        if self.item_embed_overrides is not None:
            kwargs["item_embed_overrides"] = [
                None if per_item is None else _vectors(per_item)
                for per_item in self.item_embed_overrides
            ]
        return kwargs


def _vectors(values) -> list:
    """Override vectors (lists of floats or tensors) as float32 tensors."""
    import torch

    return [torch.as_tensor(v, dtype=torch.float32) for v in values]
