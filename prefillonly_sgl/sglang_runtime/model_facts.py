"""What the served model is, resolved once when its scoring path starts (plain Python
over SGLang's ModelConfig, read by attribute): every door (the Engine, the server's
checks and routes, the DSL's server backend) reads this one object, and nothing decides
it again per request.

    facts = model_facts(tokenizer_manager.model_config, limits)   # ScoringFront, at start
    facts.head            the classification head (a fine-tuned classifier or reward
                          model of a family in the table), or None: it reads label tokens
    facts.reads_labels    a causal LM: score requests need label tokens
    facts.readout         how it answers decisions (decisions/checkpoints.py)
    facts.limits          the scheduler's limits (model_limits.py)
    facts.image_placeholder  how a vision-language model marks an image in text (its
                          processor's placeholder and pad token), or None: text only
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillonly_sgl.decisions.checkpoints import Readout, readout_of
from prefillonly_sgl.models.families import HEAD_ARCHITECTURES
from prefillonly_sgl.scoring.class_head import ClassHead
from prefillonly_sgl.scoring.image_prompts import ImagePlaceholder, image_refusal
from prefillonly_sgl.scoring.validation import ModelLimits


@dataclass(frozen=True)
class ModelFacts:
    limits: ModelLimits
    architectures: tuple[str, ...]
    reads_labels: bool  # SGLang's is_generation: a causal LM reading label tokens
    head: ClassHead | None
    readout: Readout
    image_placeholder: ImagePlaceholder | None = None
    image_refusal: str | None = None  # why images are refused here (image_prompts.py)

    @property
    def class_labels(self) -> tuple[str, ...] | None:
        """A head's classes in id order; None for a model that reads label tokens."""
        return None if self.head is None else self.head.labels

    def info(self) -> dict:
        """What /server_info and Engine.get_server_info() report of it."""
        return {
            "decision_readout": self.readout.info(),
            "class_head": None if self.head is None else self.head.info(),
        }


def model_facts(
    model_config, limits: ModelLimits, mm_processor=None, attention_backend: str | None = None
) -> ModelFacts:
    """The facts of SGLang's ModelConfig (its hf_config, is_generation and the decision
    files it loaded) and of its multimodal processor (the tokenizer manager's
    mm_processor: None for a text model)."""
    hf = model_config.hf_config
    architectures = tuple(getattr(hf, "architectures", None) or ())
    head = None
    if not model_config.is_generation:
        heads = [a for a in architectures if a in HEAD_ARCHITECTURES]
        if heads:
            head = ClassHead.from_config(heads[0], hf.num_labels, getattr(hf, "id2label", None))
    readout = readout_of(
        model_config.decision_config, model_config.joint_head_config, model_config.pointer_head
    )
    return ModelFacts(
        limits=limits,
        architectures=architectures,
        reads_labels=bool(model_config.is_generation),
        head=head,
        readout=readout,
        image_placeholder=image_placeholder(mm_processor),
        image_refusal=image_refusal(architectures, attention_backend),
    )


def image_placeholder(mm_processor) -> ImagePlaceholder | None:
    """The image placeholder of SGLang's multimodal processor (its mm_tokens: the text
    it expands and the token it expands to), or None where the model reads no images."""
    tokens = getattr(mm_processor, "mm_tokens", None)
    text = getattr(tokens, "image_token", None)
    pad = getattr(tokens, "image_token_id", None)
    if not isinstance(text, str) or not text or not isinstance(pad, int):
        return None
    return ImagePlaceholder(text, pad)
