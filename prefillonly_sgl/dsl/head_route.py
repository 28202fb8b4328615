"""A DSL function on a model with a classification head (a fine-tuned classifier): its
prompts are sent without labels, the head answers its classes (the checkpoint's
id2label), and each row comes back in the function's label order.

The function's labels must be the head's classes (any order, by name): a classifier
declared for the head's classes runs on the head, and one whose labels differ is refused
before anything is sent, naming both. A reward model (one output) has no classes to
choose among, and a head's scores are read as probabilities (normalize=True).
"""

from __future__ import annotations

from prefillonly_sgl.dsl.request_sending import DEFAULT_IN_FLIGHT, send
from prefillonly_sgl.scoring.errors import InvalidRequestError


def head_label_order(function, class_labels: tuple[str, ...]) -> list[int]:
    """For each of the function's labels, its class index in the head; InvalidRequestError
    naming both label sets when they differ."""
    name = function.fn.__qualname__
    labels = [str(label) for label in function.labels.texts]
    if len(class_labels) == 1:
        raise InvalidRequestError(
            f"{name}: the model's head has one output (a reward score, {class_labels[0]!r}), "
            "not classes to choose among: score it with Engine.score(..., apply_softmax=False)"
        )
    if sorted(labels) != sorted(class_labels):
        raise InvalidRequestError(
            f"{name}: its labels {labels} are not the model's classes {list(class_labels)} "
            "(its classification head's id2label): declare the head's classes as the labels"
        )
    if not function.normalize:
        raise InvalidRequestError(
            f"{name}: normalize=False reads probabilities over a vocabulary; a "
            "classification head answers probabilities over its classes (normalize=True)"
        )
    return [class_labels.index(label) for label in labels]


class HeadRoute:
    """The job's prompts as label-less score requests, answered by the backend's head."""

    calibrates_here = True

    def __init__(self, backend, function, class_labels: tuple[str, ...]) -> None:
        self.backend = backend
        self.order = head_label_order(function, class_labels)

    async def rows(self, job, progress=None, max_in_flight=DEFAULT_IN_FLIGHT):
        compiled = job.compile_for_head(self.backend.tokenizer)
        answers = await send(self.backend.answer, compiled, progress, max_in_flight)
        return [[row[i] for i in self.order] for row in compiled.gather(answers)]
