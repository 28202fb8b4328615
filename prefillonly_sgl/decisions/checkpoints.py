"""Decision checkpoints: models trained to answer /v1/systemone, and the readout each one
answers with (plain Python; SGLang 0.5.23's loaders find the files, the server reads
what they found: sglang_runtime/http_server/systemone_checkpoints.py).

    lm_head        any causal LM: the generic prompt, the labels' logits (decisions/)
    decision_config  a Qwen3.5 backbone with decision_config.json: the trained prompt, the
                   codes' logits at the answer position, the calibrated temperature;
                   causal, or noncausal_full_attention (full attention reads the whole
                   prompt, so no prefix of it can be cached)
    joint_schema_head  Clef (joint_head_config.json): every question in one prompt, one
                   prefill, a head over the hidden states at the layout's spans
    pointer_head   Kev (head.pt): each question its own prompt behind the state, a head
                   over the hidden states at the options' closing tokens

/v1/decisions refuses a decision checkpoint with SGLang's pointer to /v1/systemone
(DECISIONS_REFUSAL), Engine.decide and the DSL's @decision with the same pointer
(CHECKPOINT_REFUSAL): their questions have no place in the trained prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

NONCAUSAL = "noncausal_full_attention"

# SGLang's own words (serving_decisions.OpenAIServingDecisions._validate_request), so a
# client of either server reads the same refusal.
DECISIONS_REFUSAL = (
    "/v1/decisions does not serve decision checkpoints, use /v1/systemone, "
    "which renders the prompt and answer codes they were trained with"
)
# The same for the engine's own doors (Engine.decide, the DSL's @decision and deciders).
CHECKPOINT_REFUSAL = (
    "decisions on the LM head (Engine.decide, @decision, /v1/decisions) do not serve "
    "decision checkpoints: serve the model and use /v1/systemone, which renders the "
    "prompt and answer codes they were trained with"
)


@dataclass(frozen=True)
class Readout:
    """How the served model answers decisions (server info, /v1/models)."""

    kind: str  # lm_head | decision_config | joint_schema_head | pointer_head
    attention_mode: str = "causal"
    temperature: float | None = None  # decision_config's calibrated temperature
    codes: tuple[str, ...] = ()

    @property
    def is_checkpoint(self) -> bool:
        return self.kind != "lm_head"

    @property
    def shares_the_state(self) -> bool:
        """Whether the questions' prompts run behind the state computed once and cached:
        not where full attention reads the whole prompt, and not for Clef, whose one
        prompt holds every question (its head reads every token's hidden state, which no
        cache keeps)."""
        return self.kind != "joint_schema_head" and self.attention_mode != NONCAUSAL

    def info(self) -> dict:
        data = {"kind": self.kind, "attention_mode": self.attention_mode}
        if self.temperature is not None:
            data["temperature"] = self.temperature
        if self.codes:
            data["codes"] = list(self.codes)
        data["route"] = "/v1/systemone" if self.is_checkpoint else "/v1/systemone, /v1/decisions"
        data["state_computed_once"] = self.shares_the_state or self.kind == "joint_schema_head"
        data["state_cached_across_requests"] = self.shares_the_state
        return data


LM_HEAD = Readout("lm_head")


def readout_of(
    decision_config: dict | None, joint_head_config: dict | None, pointer_head: dict | None
) -> Readout:
    """The readout from what SGLang's ModelConfig loaded (its decision_config,
    joint_head_config and pointer_head attributes; None where the file is absent)."""
    if joint_head_config is not None:
        return Readout("joint_schema_head")
    if pointer_head is not None:
        return Readout("pointer_head", temperature=float(pointer_head.get("temperature", 1.0)))
    if decision_config is not None:
        return Readout(
            "decision_config",
            attention_mode=decision_config.get("attention_mode", "causal"),
            temperature=float(decision_config["temperature"]),
            codes=tuple(decision_config["codes"]),
        )
    return LM_HEAD


def shared_prefix_len(prompts: list[list[int]]) -> int:
    """How many leading tokens every prompt shares (the state and what precedes it), at
    most each prompt's length less one: every question keeps a token of its own, the
    position its answer is read at."""
    if len(prompts) < 2:
        return 0
    first = prompts[0]
    bound = min(len(p) for p in prompts) - 1
    n = 0
    while n < bound and all(p[n] == first[n] for p in prompts):
        n += 1
    return n


def layout_behind_prefix(layout: list[int], cached: int) -> list[int] | None:
    """A decision layout (SGLang's pack_decision_layout: [prompt_length, questions, then
    per question type, start, end, options, and each option's start, end]) placed on the
    part of its prompt a forward computes after `cached` tokens came from the prefix
    cache: every position less `cached`. None where a span starts inside the cached part
    (its hidden states were never computed here): SGLang's head then scores nothing,
    which its route reports as a server error."""
    if cached <= 0:
        return list(layout)
    prompt_length, questions = layout[0], layout[1]
    out = [prompt_length - cached, questions]
    cursor = 2
    for _ in range(questions):
        kind, start, end, options = layout[cursor : cursor + 4]
        spans = layout[cursor + 4 : cursor + 4 + 2 * options]
        cursor += 4 + 2 * options
        if min([start, *spans]) < cached:
            return None
        out += [kind, start - cached, end - cached, options, *(p - cached for p in spans)]
    return out + layout[cursor:]  # trailing values: SGLang's parser refuses them itself
