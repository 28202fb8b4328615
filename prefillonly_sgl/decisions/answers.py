"""From the options' probabilities to each question's answer (plain Python).

Per prompt, each option's probability over the model's whole vocabulary (its label's
tokens by the chain rule) comes back from the score requests. Per question:

- label_mass: the options' summed probability, i.e. how much of what the model would
  write next is one of the options at all (averaged over the option orders asked);
- probabilities: the options' log-probabilities divided by the temperature and
  normalised over the options (temperature 1: p_i / sum p), then averaged over the option
  orders asked (debiasing: a position the model favours is every option's in turn);
- with calibration, the same for each content-free state (the prior), averaged, divided
  out and renormalised (scoring/priors.py, the DSL's rule: p_i ~ p_i / prior_i);
- confidence, as the peers publish it (TypeSafe's formulas, in llama.cpp's and SGLang's
  servers): a choice or yes/no `max(0, (p_max - 1/n) / (1 - 1/n))`; a score
  `max(0, 1 - sum_i p_i |i - mode| / mean_i |i - (n-1)/2|)`;
- a refusal where the question cannot be asked (its prompt past the context) or, when the
  call sets min_label_mass, where the options' mass is below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefillonly_sgl.decisions.call import Question, QuestionResult
from prefillonly_sgl.decisions.plan import DecisionPlan
from prefillonly_sgl.scoring.priors import average, divide_prior


def normalise(raw: Sequence[float], temperature: float = 1.0) -> list[float]:
    """Option probabilities from their whole-vocabulary probabilities."""
    logs = [math.log(p) / temperature if p > 0 else -math.inf for p in raw]
    top = max(logs)
    if top == -math.inf:
        return [1.0 / len(raw)] * len(raw)  # no option has any mass: nothing to prefer
    weights = [math.exp(x - top) for x in logs]
    total = math.fsum(weights)
    return [w / total for w in weights]


def confidence(question: Question, probabilities: Sequence[float]) -> float:
    n = len(probabilities)
    if n < 2:
        return 1.0
    if question.kind == "score":
        mode = max(range(n), key=probabilities.__getitem__)
        spread = math.fsum(p * abs(i - mode) for i, p in enumerate(probabilities))
        typical = math.fsum(abs(i - (n - 1) / 2) for i in range(n)) / n
        return max(0.0, 1.0 - spread / typical)
    return max(0.0, (max(probabilities) - 1 / n) / (1 - 1 / n))


def results(plan: DecisionPlan, raw_by_prompt: dict[int, list[float]]) -> list[QuestionResult]:
    """Each question's answer from each prompt's raw option probabilities (indexed like
    plan.prompts, options in the question's order)."""
    call = plan.call
    out = []
    for q, question in enumerate(call.questions):
        mine = [i for i, p in enumerate(plan.prompts) if p.question == q]
        first = plan.prompts[mine[0]]
        if q in plan.refusals:
            out.append(_refused(question, plan.refusals[q], first))
            continue
        own = [raw_by_prompt[i] for i in mine if plan.prompts[i].state == 0]
        mass = math.fsum(math.fsum(r) for r in own) / len(own)
        probs = average([normalise(r, call.temperature) for r in own])
        if call.calibrate:
            priors = [
                normalise(raw_by_prompt[i], call.temperature)
                for i in mine
                if plan.prompts[i].state != 0
            ]
            probs = divide_prior(probs, average(priors))
        if mass < call.min_label_mass:
            reason = f"the options' label mass {mass:.3g} is below min_label_mass"
            out.append(_refused(question, reason, first, mass))
            continue
        out.append(
            QuestionResult(
                question=question,
                probabilities=tuple(probs),
                label_mass=mass,
                confidence=confidence(question, probs),
                prompt_token_ids=first.ids,
                label_token_ids=first.labels,
            )
        )
    return out


def _refused(question: Question, reason: str, first, mass: float = 0.0) -> QuestionResult:
    n = len(question.options)
    return QuestionResult(
        question=question,
        probabilities=tuple([1.0 / n] * n),
        label_mass=mass,
        confidence=0.0,
        refusal=reason,
        prompt_token_ids=first.ids,
        label_token_ids=first.labels,
    )
