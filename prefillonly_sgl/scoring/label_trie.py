"""Labels of several tokens: which forwards score them, and how their probabilities combine
(plain Python, unit-tested without SGLang).

The probability of a label of k tokens t1..tk after a prompt is the product of the model's
conditional next-token probabilities:

    P(label | prompt) = P(t1 | prompt) * P(t2 | prompt t1) * ... * P(tk | prompt t1..tk-1)

Each factor is read at the last position of one prefill-only forward: the prompt itself
(the root, as a single-token label is scored today) and the prompt followed by each proper
prefix t1..tj of a label (a *node*). Labels that share first tokens share those nodes (a
trie): "very good" and "very bad" need the root and one node, "very", whose forward gives
both P(good | ... very) and P(bad | ... very). A node's forward extends the prompt by j
tokens and finds the prompt in the prefix cache (the runtime keeps the prompt's KV for it).

Scores from the labels' sequence log-probabilities s (sum of the factors' log-probs; with
length_normalize, their mean, i.e. per-token):
  - normalised (default): softmax of s over the labels: they sum to 1 (of s / temperature
    with a temperature, SGLang's calibration of one-token labels carried to several);
  - raw: exp(s): the label's probability over everything the model could write (with
    length_normalize the geometric mean of its token probabilities).
With no end-of-label marker, "yes" and "yes sir" are both allowed: each probability is
that of the model writing those tokens next, whatever follows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Label = tuple[int, ...]


@dataclass(frozen=True)
class LabelTrie:
    labels: tuple[Label, ...]  # each label's token ids, in the caller's order
    # Every prefix that needs a forward, () (the root: the prompt alone) first, then by
    # length: the proper prefixes of the labels of two or more tokens.
    nodes: tuple[Label, ...]
    # Per node: the distinct next tokens of the labels below it (first-seen order): what
    # its forward reads.
    next_tokens: dict[Label, tuple[int, ...]]

    @property
    def one_token_labels(self) -> bool:
        """All labels are one token each: one forward per prompt. ("single_token" names
        only the OpenAI requests of one output token: prefillonly_sgl/single_token/.)"""
        return all(len(label) == 1 for label in self.labels)

    @property
    def continuations(self) -> tuple[Label, ...]:
        """The nodes after the root: the label prefixes appended to the prompt."""
        return self.nodes[1:]


def build_trie(labels: Sequence[Sequence[int]]) -> LabelTrie:
    """The trie of label token sequences (already validated: non-empty, distinct)."""
    labels = tuple(tuple(label) for label in labels)
    next_tokens: dict[Label, list[int]] = {}
    for label in labels:
        for j, token in enumerate(label):
            following = next_tokens.setdefault(label[:j], [])
            if token not in following:
                following.append(token)
    nodes = tuple(sorted(next_tokens, key=len))  # sorted() is stable: first-seen order
    return LabelTrie(labels, nodes, {node: tuple(next_tokens[node]) for node in nodes})


def label_token_logprobs(
    trie: LabelTrie, node_logprobs: dict[Label, Sequence[float]]
) -> list[list[float]]:
    """Each label's log-probability per token (the factors of the chain rule, in order).
    node_logprobs[node][i]: the log-prob (over the vocabulary) of trie.next_tokens[node][i]
    at that node's forward."""
    by_token = {
        node: dict(zip(trie.next_tokens[node], node_logprobs[node], strict=True))
        for node in trie.nodes
    }
    return [[by_token[label[:j]][token] for j, token in enumerate(label)] for label in trie.labels]


def sequence_logprobs(trie: LabelTrie, node_logprobs: dict[Label, Sequence[float]]) -> list[float]:
    """Each label's summed log-probability (node_logprobs as label_token_logprobs reads it)."""
    return [math.fsum(row) for row in label_token_logprobs(trie, node_logprobs)]


def label_scores(
    logprobs: Sequence[float],
    lengths: Sequence[int],
    apply_softmax: bool = True,
    length_normalize: bool = False,
    temperature: float = 1.0,
) -> list[float]:
    """Scores from the labels' sequence log-probs (see the module docstring)."""
    s = (
        [lp / n for lp, n in zip(logprobs, lengths, strict=True)]
        if length_normalize
        else list(logprobs)
    )
    if not apply_softmax:
        return [math.exp(x) if x != -math.inf else 0.0 for x in s]
    top = max(s)
    if top == -math.inf:  # a model's log-probs are finite; nothing to normalise otherwise
        raise ValueError("no label has a finite log-probability: cannot normalise")
    weights = [math.exp((x - top) / temperature) for x in s]
    total = math.fsum(weights)
    return [w / total for w in weights]
