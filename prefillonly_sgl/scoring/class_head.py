"""ClassHead: what a model with a classification head answers (plain Python).

A fine-tuned classifier or reward model (`*ForSequenceClassification`; a reward model: one label)
has a head over the decoder's last hidden state instead of reading label tokens: SGLang
serves it as a scoring model whose score request takes no label_token_ids and answers each
item's class scores (the head's logits; with apply_softmax their softmax, over a
temperature when given). Its classes are the checkpoint's `id2label`, in id order; a
reward model has one (its score, never softmaxed to 1.0: docs/heads.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prefillonly_sgl.scoring.errors import InvalidRequestError


@dataclass(frozen=True)
class ClassHead:
    architecture: str
    labels: tuple[str, ...]  # class names in id order (id2label, or "LABEL_i")

    @classmethod
    def from_config(cls, architecture: str, num_labels: int, id2label: Mapping | None) -> ClassHead:
        """The head of a config: its `num_labels` classes named by `id2label` (keys may be
        ints or their strings, as config.json writes them)."""
        names = {int(k): str(v) for k, v in (id2label or {}).items()}
        return cls(architecture, tuple(names.get(i, f"LABEL_{i}") for i in range(num_labels)))

    @property
    def is_reward_model(self) -> bool:
        """One output: a score, not a distribution over classes."""
        return len(self.labels) == 1

    def check_no_labels(self, label_token_ids: object) -> None:
        """A head answers its own classes: label_token_ids must be absent (None or [])."""
        if label_token_ids not in (None, [], ()):
            raise InvalidRequestError(
                f"this model has a classification head ({self.architecture}): it answers "
                f"its own classes {list(self.labels)}, so give no label_token_ids"
            )

    def check_softmax(self, apply_softmax: bool) -> None:
        """A reward model's one score softmaxed is always 1.0: refused, not answered."""
        if apply_softmax and self.is_reward_model:
            raise InvalidRequestError(
                f"{self.architecture} has one output (a reward score): apply_softmax over "
                "it is always 1.0; ask with apply_softmax=false for the score"
            )

    def info(self) -> dict:
        return {"architecture": self.architecture, "labels": list(self.labels)}
