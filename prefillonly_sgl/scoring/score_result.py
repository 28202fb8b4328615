"""ScoreResult: what Engine.score, the server's typed endpoints and the DSL's backends get
back from one score call (plain Python)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ScoreResult(Sequence):
    """scores[i][j]: probability of label j after item i (normalised over the labels with
    apply_softmax=True, over the whole vocabulary with False); prompt_tokens: tokens of all
    prompts together, as SGLang reports them; cached_tokens: how many of those SGLang took
    from its prefix cache; token_logprobs (asked with return_token_logprobs): each label's
    full-vocabulary log-probability per item, before temperature and the softmax over the
    labels, as SGLang's ScoreResult has them (SGLang 0.5.23 leaves the list empty for a
    setwise request).

    It also behaves as the list of per-item rows that SGLang's score API returns
    (result[i], len(result), iteration, == a list of lists), so code written against
    SGLang's Engine.score keeps working.
    """

    scores: list[list[float]]
    prompt_tokens: int
    cached_tokens: int = 0
    token_logprobs: list | None = None
    # a classification head's pre-head hidden state per item (return_pooled_hidden_states)
    pooled_hidden_states: list | None = None

    def __getitem__(self, index):
        return self.scores[index]

    def __len__(self) -> int:
        return len(self.scores)

    def __iter__(self) -> Iterator[list[float]]:
        return iter(self.scores)

    def __eq__(self, other) -> bool:
        if isinstance(other, ScoreResult):
            return (self.scores, self.prompt_tokens, self.cached_tokens) == (
                other.scores,
                other.prompt_tokens,
                other.cached_tokens,
            )
        if isinstance(other, list | tuple):
            return self.scores == list(other)
        return NotImplemented

    __hash__ = None  # holds lists: not hashable


@dataclass(frozen=True)
class LabelTokenLogprobs:
    """Per item, per label, each of the label's tokens' log-probability (over the
    vocabulary) where it follows the prompt and the label's earlier tokens: the factors of
    the chain rule (ScoringFront.label_token_logprobs; choice requests read their answer
    from them). prompt_tokens / cached_tokens: every forward of the call; prompt_cached_tokens:
    the prompts' own prefix-cache hits (the first round's); prompt_own_tokens: the
    prompts' own tokens (the first round's, images expanded)."""

    rows: list[list[list[float]]]
    prompt_tokens: int
    cached_tokens: int
    prompt_cached_tokens: int
    prompt_own_tokens: int = 0
