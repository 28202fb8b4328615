"""What `prefillonly verify` asks an engine and what it compares the answers with: the
probes for one model (prompts sized to cross its sliding window and the small hybrid
chunk, single- and several-token labels, the echo ids, a continuation, a decision; on a
vision-language model, the items about an image, cold and from the cache), the
transformers reference's answers to them (computed once, verification/reference.py), and
run_probes, which asks one running engine each probe and returns a Check per probe (the
largest difference from the reference, pass / fail at the tolerance, or the error)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache

SMALL_CHUNK = 16  # hybrid prefilling's smallest chunk: the long probe runs in several
PROBES = ("cold", "cached", "long", "labels", "echo", "continuation", "decisions", "images")
HEAD_PROBES = ("cold", "long", "cached")  # what a classification head answers
_QUERY = (
    "User profile: likes science fiction, history books and long walks.\n"
    "Question: is this item relevant to the user? Answer Yes or No.\n"
)
_SHORT_ITEM = "Item: a documentary about the history of the moon landing.\nAnswer:"
_FILLER = (
    "Credit history: two loans, one late payment, savings account, owns a house. "
    "Review: this medicine worked well and I feel much better now. "
)
_STATE = "Review: terrible side effects, I would not take it again."


@dataclass
class Check:
    max_diff: float | None = None
    ok: bool = False
    error: str | None = None
    applies: bool = True  # False: the probe means nothing for this model (a head's labels)


@dataclass
class Probes:
    query: str
    items: list[str]
    labels: list[int]
    sequences: list[list[int]]
    echo_ids: list[int]
    continuation: str
    long_tokens: int
    image: bytes | None = None  # a vision-language model's probe image (probe_image)


def probe_image(size: int = 56, seed: int = 86) -> bytes:
    """A seeded size x size PNG of noise (every pixel matters to the vision tower): the
    image the items of the images probe are about (the image tests' too)."""
    import io
    import random

    from PIL import Image

    rng = random.Random(seed)
    image = Image.new("RGB", (size, size))
    image.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(size * size)])
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def sliding_window_of(config: dict) -> int | None:
    """The config's sliding window (text_config's for a ConditionalGeneration one), None
    without one or where layer_types has no sliding layer."""
    text = config.get("text_config") or config
    window = text.get("sliding_window")
    types = text.get("layer_types")
    if types is not None and "sliding_attention" not in types:
        return None
    if text.get("use_sliding_window") is False:
        return None
    return int(window) if window else None


def make_probes(tokenizer, config: dict) -> Probes:
    """Prompts for this model: the long one crosses the sliding window (if any) and the
    small hybrid chunk several times."""
    window = sliding_window_of(config) or 0
    target = max(3 * SMALL_CHUNK, 2 * window + 8)
    long_item = _SHORT_ITEM
    while len(tokenizer.encode(_QUERY + long_item)) <= target:
        long_item = _FILLER + long_item
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    labels = [encode(" Yes")[0], encode(" No")[0]]
    if labels[0] == labels[1]:
        labels = [encode("Yes")[0], encode("No")[0]]
    sequences = [encode(w) for w in (" Yes", " No", " not really sure")]
    if all(len(s) == 1 for s in sequences):
        sequences.append(labels[::-1])
    return Probes(
        query=_QUERY,
        items=[_SHORT_ITEM, long_item],
        labels=labels,
        sequences=sequences,
        echo_ids=tokenizer.encode(_QUERY + long_item),
        continuation=" Yes, it is relevant.",
        long_tokens=len(tokenizer.encode(_QUERY + long_item)),
    )


@dataclass
class Expected:
    """The reference's answers, computed once."""

    scores: list[list[float]]
    sequences: list[list[float]]
    echo: list[float | None]
    continuation: list[list[float]]
    # The continuation computed in two forwards split at the query's end, as an engine
    # with prefill-only KV computes a recurrent family's cold prompt (None: not needed).
    continuation_split: list[list[float]] | None = None
    # A vision-language model: the labels' probabilities after the image (its model's
    # placeholder -> one row per item), from verification/image_reference.py; computed
    # when the first engine tells its placeholder (None: a model that reads text only).
    images: Callable[[str], list[list[float]]] | None = None

    def for_engine_that_splits(self) -> Expected:
        """The answers an engine that splits at the prefix is held to: the same, with the
        continuation computed as it computes it. Float32 makes the two orders differ by
        more than the tolerance on some checkpoints (transformers itself: 3.1e-4 on one
        token of the tiny Qwen3.5-MoE, seed 0), which is the model's conditioning, not
        the engine's error (docs/models.md, "The families, measured")."""
        if self.continuation_split is None:
            return self
        return replace(self, continuation=self.continuation_split)


def reference_answers(
    reference, probes: Probes, split_at_query: bool = False, head: bool = False
) -> Expected:
    """split_at_query: also the continuation split where the query ends (a family whose
    cold prompts prefill-only KV splits there, Family.splits_at_prefix). head: a
    classification head's logits are the scores, and nothing else is asked."""
    if head:
        scores = reference.class_scores(probes.query, probes.items, apply_softmax=False)
        return Expected(scores=scores, sequences=[], echo=[], continuation=[])
    split = (
        reference.continuation_logprobs(
            probes.query, probes.items, probes.continuation, split_at_query=True
        )
        if split_at_query
        else None
    )
    return Expected(
        scores=reference.score(probes.query, probes.items, probes.labels, apply_softmax=False),
        sequences=reference.score_sequences(probes.query, probes.items, probes.sequences),
        echo=reference.prompt_logprobs(probes.echo_ids),
        continuation=reference.continuation_logprobs(
            probes.query, probes.items, probes.continuation
        ),
        continuation_split=split,
    )


def image_answers(image_reference, probes: Probes) -> Callable[[str], list[list[float]]]:
    """The images probe's reference answers, given the engine's image placeholder (the
    engine puts the image before the query, where the placeholder goes): each item's
    labels' probabilities from a transformers forward through the model's own processor.
    Computed once per placeholder."""

    @cache
    def answers(placeholder: str) -> list[list[float]]:
        return [
            image_reference.label_probabilities(
                placeholder + probes.query + item, [probes.image], probes.labels, softmax=False
            )
            for item in probes.items
        ]

    return answers


def max_abs_diff(a, b) -> float:
    """The largest |a - b| over nested lists (None entries must be None in both)."""
    if isinstance(a, list | tuple):
        if not isinstance(b, list | tuple) or len(a) != len(b):
            raise ValueError(f"shapes differ: {len(a)} vs {b!r:.80}")
        return max((max_abs_diff(x, y) for x, y in zip(a, b)), default=0.0)
    if a is None or b is None:
        if a is None and b is None:
            return 0.0
        raise ValueError("a value is missing")
    diff = abs(float(a) - float(b))
    return math.inf if math.isnan(diff) else diff


def _decision_probabilities(decision) -> list[float]:
    return [p.probability for answer in decision.answers for p in answer.probabilities]


def run_probes(
    engine, probes: Probes, expected: Expected, tolerance: float, first_decision, head=False
):
    """Each probe's Check on one engine; returns (checks, the decision's probabilities).
    head: a classification head's class scores (cold, long, cached; no labels sent)."""
    from prefillonly_sgl.sglang_runtime.echo_logprobs import echo_prompt_logprobs

    checks: dict[str, Check] = {}
    cold_rows = []  # the cold call's rows: its second item is the long probe
    decision_probs = None

    def check(name, compute):
        try:
            diff = compute()
            checks[name] = Check(diff, diff <= tolerance)
        except Exception as e:  # a probe's failure is a result, not the end of the run
            checks[name] = Check(None, False, first_line(e))

    labels = None if head else probes.labels

    def cold():
        got = engine.score(probes.query, probes.items, labels, apply_softmax=False)
        cold_rows.extend(got.scores)
        return max_abs_diff(got.scores[:1], expected.scores[:1])

    def long():
        return max_abs_diff(cold_rows[1:], expected.scores[1:])

    def cached():
        got = engine.score(probes.query, probes.items, labels, apply_softmax=False)
        if got.cached_tokens <= 0:
            raise AssertionError("the repeated call took no token from the prefix cache")
        return max_abs_diff(got.scores, expected.scores)

    def several_token_labels():
        got = engine.score(probes.query, probes.items, probes.sequences)
        return max_abs_diff(got.scores, expected.sequences)

    def echo():
        diffs = []
        for _ in range(2):  # the second is a cache hit: served from the side table
            got = engine.run_until_complete(
                echo_prompt_logprobs(engine.tokenizer_manager, probes.echo_ids)
            )
            diffs.append(max_abs_diff(got, expected.echo))
        return max(diffs)

    def continuation():
        got = engine.continuation_logprobs(probes.query, probes.items, probes.continuation)
        return max_abs_diff(got.token_logprobs, expected.continuation)

    def decisions():
        nonlocal decision_probs
        decision = engine.decide(
            _STATE,
            [
                {
                    "type": "choice",
                    "instructions": "How does the reviewer feel?",
                    "choices": [{"value": "good"}, {"value": "very bad"}],
                }
            ],
        )
        decision_probs = _decision_probabilities(decision)
        if abs(sum(decision_probs) - 1) > 1e-6:
            raise AssertionError(f"probabilities sum to {sum(decision_probs)}")
        return 0.0 if first_decision is None else max_abs_diff(decision_probs, first_decision)

    check("cold", cold)
    if cold_rows:
        check("long", long)
    else:
        checks["long"] = Check(None, False, "the cold call failed")
    check("cached", cached)
    if head:
        for name in PROBES:
            checks.setdefault(name, Check(ok=True, applies=False))
        return {name: checks[name] for name in PROBES}, None
    check("labels", several_token_labels)
    check("echo", echo)
    check("continuation", continuation)
    check("decisions", decisions)
    if probes.image is None or expected.images is None:
        checks["images"] = Check(ok=True, applies=False)
    else:
        check("images", lambda: _images(engine, probes, expected))
    return {name: checks[name] for name in PROBES}, decision_probs


def _images(engine, probes: Probes, expected: Expected) -> float:
    """The items about the probe image, cold then again (the image and the query from the
    prefix cache), against the reference: the largest difference of the two."""
    placeholder = engine.image_placeholder
    if placeholder is None:
        raise AssertionError("the engine reads no images, though the model's family does")
    want = expected.images(placeholder)
    diffs = []
    for attempt in ("cold", "cached"):
        got = engine.score(
            probes.query, probes.items, probes.labels, apply_softmax=False, images=[probes.image]
        )
        if attempt == "cached" and got.cached_tokens <= 0:
            raise AssertionError("the repeated call about the image took nothing from the cache")
        diffs.append(max_abs_diff(got.scores, want))
    return max(diffs)


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
