"""Which choice answers, from the choices' token log-probabilities (plain Python).

Each choice is scored as its tokens after the prompt (the labels machinery: the chain
rule through the prefix cache). Where one choice's tokens are a prefix of another's
("yes", "yes sir"), the shorter one's probability would contain the longer's, and a
decoder under the constraint would have to decide whether to stop: every choice of that
slot is then scored with what follows it appended (the end-of-sequence token after a
plain choice, the first token of the fixed JSON text after a field), so each choice's
probability is that of the model writing it and then ending it.

- **Greedy** (temperature 0): what greedy decoding under the constraint returns: at each
  step the most probable next token among the choices still possible (the lowest choice
  on a tie), until one choice is left.
- **Sampled** (temperature > 0): a choice drawn from the choices' probabilities at that
  temperature (softmax of the sequence log-probabilities over it), after top-k, top-p and
  min-p over them; seeded by the request's seed, the answer's index and the field.
- **choice_probabilities**: the softmax of the sequence log-probabilities (temperature 1):
  the model's probability of each choice given that the answer is one of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefillonly_sgl.single_token.allowed_tokens import is_greedy, restricted_choice

Tokens = tuple[int, ...]


def prefix_free(choices: Sequence[Tokens]) -> bool:
    """No choice's tokens are a proper prefix of another's."""
    ordered = sorted(choices)
    return all(not (len(b) > len(a) and b[: len(a)] == a) for a, b in zip(ordered, ordered[1:]))


def terminated(
    choices: Sequence[Tokens], terminator: int | None
) -> tuple[tuple[Tokens, ...], bool]:
    """The choices as scored: with the terminator appended to each when the set is not
    prefix-free (and a terminator exists), else as they are."""
    choices = tuple(tuple(c) for c in choices)
    if prefix_free(choices) or terminator is None:
        return choices, False
    return tuple(c + (terminator,) for c in choices), True


def greedy_index(choices: Sequence[Tokens], logprobs: Sequence[Sequence[float]]) -> int:
    """The choice greedy decoding under the constraint writes (see the module doc)."""
    alive = list(range(len(choices)))
    depth = 0
    while len(alive) > 1:
        candidates = [i for i in alive if len(choices[i]) > depth]
        if not candidates:  # identical choices: cannot happen after validation
            break
        best = max(candidates, key=lambda i: (logprobs[i][depth], -i))
        token = choices[best][depth]
        alive = [i for i in candidates if choices[i][depth] == token]
        depth += 1
    return alive[0]


def sequence_logprobs(logprobs: Sequence[Sequence[float]]) -> list[float]:
    return [math.fsum(row) for row in logprobs]


def probabilities(sequences: Sequence[float]) -> list[float]:
    """Softmax of the sequence log-probabilities (temperature 1)."""
    top = max(sequences)
    weights = [math.exp(s - top) for s in sequences]
    total = math.fsum(weights)
    return [w / total for w in weights]


def pick(
    choices: Sequence[Tokens],
    logprobs: Sequence[Sequence[float]],
    sampling: Mapping,
    draw: str = "0",
) -> int:
    """The answering choice's index: greedy, or sampled at the request's temperature
    (``sampling``: the resolved temperature, top_p, top_k, min_p, sampling_seed)."""
    if is_greedy(sampling) or len(choices) == 1:
        return greedy_index(choices, logprobs)
    temperature = sampling.get("temperature") or 1.0
    rows = [(s / temperature, i, None) for i, s in enumerate(sequence_logprobs(logprobs))]
    return restricted_choice(rows, sampling, draw)[1]


@dataclass(frozen=True)
class Step:
    """One token of the answer: its id, its log-probability over the vocabulary (None:
    fixed text the schema forces, not read from the model) and the tokens the constraint
    allowed at that step with theirs, most probable first."""

    token: int
    logprob: float | None
    allowed: tuple[tuple[int, float], ...]


def steps(
    choices: Sequence[Tokens], logprobs: Sequence[Sequence[float]], chosen: int
) -> list[Step]:
    """The chosen choice's tokens as Steps (its terminator included, when scored)."""
    path = choices[chosen]
    out = []
    for depth, token in enumerate(path):
        allowed: dict[int, float] = {}
        for i, other in enumerate(choices):
            if len(other) > depth and other[:depth] == path[:depth]:
                allowed.setdefault(other[depth], logprobs[i][depth])
        ranked = sorted(allowed.items(), key=lambda kv: (-kv[1], kv[0]))
        out.append(Step(token, logprobs[chosen][depth], tuple(ranked)))
    return out
