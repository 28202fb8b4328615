"""One moderation call and its plan (plain Python over a Hugging Face tokenizer): what the
caller asks (conversations, policies or categories, the guard) checked, and every prompt
rendered once (guards.py, guard_prompts.py) into the plan's score requests (plan.py).

    call = ModerationCall.of(inputs, policies=..., categories=..., guard=...)  # checks
    guard, plan = plan_call(tokenizer, call, recognise(tokenizer.chat_template))
"""

from __future__ import annotations

from dataclasses import dataclass

from prefillonly_sgl.moderation import guard_prompts, guards, readout
from prefillonly_sgl.moderation.flags import DEFAULT_THRESHOLD
from prefillonly_sgl.moderation.plan import ModerationPlan, Prompt, plan_moderation
from prefillonly_sgl.scoring.errors import InvalidRequestError

MAX_INPUTS = 256
MAX_POLICIES = 64
MAX_TEXT_CHARS = 200_000  # a policy's or a message's text (the prompt's length is checked
# in tokens by the scoring front, against the context)
ROLES = ("user", "assistant", "system")


@dataclass(frozen=True)
class ModerationCall:
    inputs: tuple[tuple[dict, ...], ...]  # conversations: messages {"role", "content": str}
    policies: tuple[str, ...] = ()  # a policy classifier's (or Granite Guardian's risks')
    categories: tuple[str, ...] | None = None  # the guard's categories to check (None: all)
    guard: str | None = None  # None: the one the model's chat template says
    threshold: float = DEFAULT_THRESHOLD  # the probability that flags (flags.py)

    @classmethod
    def of(
        cls, inputs, policies=None, categories=None, guard=None, threshold=DEFAULT_THRESHOLD
    ) -> ModerationCall:
        """A checked call; InvalidRequestError naming what is wrong. inputs: a text, a
        list of texts, or a list of conversations (each a list of {"role", "content"})."""
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            raise InvalidRequestError("input must be a non-empty text or list")
        if len(inputs) > MAX_INPUTS:
            raise InvalidRequestError(f"at most {MAX_INPUTS} inputs per call, got {len(inputs)}")
        conversations = tuple(_conversation(i, one) for i, one in enumerate(inputs))
        if guard is not None and guard not in guards.GUARDS:
            raise InvalidRequestError(
                f"unknown guard {guard!r}: expected one of {', '.join(guards.GUARDS)}"
            )
        return cls(
            conversations,
            _texts("policies", policies or (), MAX_POLICIES),
            None if categories is None else _texts("categories", categories, 64),
            guard,
            _threshold(threshold),
        )


def _threshold(value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InvalidRequestError(f"threshold must be a probability in (0, 1], got {value!r}")
    return float(value)


def _conversation(index: int, value) -> tuple[dict, ...]:
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise InvalidRequestError(f"input {index} must be a text or a non-empty list of messages")
    messages = []
    for m in value:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InvalidRequestError(
                f"input {index}: each message needs a role ({', '.join(ROLES)}) and a content"
            )
        content = m.get("content")
        if not isinstance(content, str) or not content.strip():
            raise InvalidRequestError(f"input {index}: a message's content must be non-empty text")
        if len(content) > MAX_TEXT_CHARS:
            raise InvalidRequestError(f"input {index}: a message is over {MAX_TEXT_CHARS} chars")
        messages.append({"role": m["role"], "content": content})
    return tuple(messages)


def _texts(name: str, values, most: int) -> tuple[str, ...]:
    if isinstance(values, str) or not all(isinstance(v, str) and v.strip() for v in values):
        raise InvalidRequestError(f"{name} must be a list of non-empty texts")
    if len(values) > most:
        raise InvalidRequestError(f"at most {most} {name} per call, got {len(values)}")
    if len(set(values)) != len(values):
        raise InvalidRequestError(f"{name} must not repeat")
    return tuple(values)


def plan_call(tokenizer, call: ModerationCall, recognised: str) -> tuple[str, ModerationPlan]:
    """(the guard the call runs as, its plan). recognised: what the model's chat template
    says (guards.recognise)."""
    guard = call.guard or recognised
    template = guards.template_for(guard, getattr(tokenizer, "chat_template", None))

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    if guard == "policy":
        if not call.policies:
            raise InvalidRequestError(
                "this model is not a guard (its chat template is none of Llama Guard 3, "
                "Qwen3Guard or Granite Guardian): give the policies to check as `policies` "
                "(each answered yes / no), or name the guard as `guard`"
            )
        prompts = [
            Prompt(
                i, p, guard_prompts.prompt_ids(tokenizer, guard_prompts.policy_prompt(c, p), False)
            )
            for i, c in enumerate(call.inputs)
            for p in call.policies
        ]
        plan = plan_moderation(
            "yes_no", prompts, len(call.inputs), encode, verdicts=readout.POLICY_VERDICTS
        )
        return guard, plan
    parts = guards.reads_text_parts(template)

    def messages(conversation):
        return [
            {"role": m["role"], "content": guards.message_content(m["content"], parts)}
            for m in conversation
        ]

    taxonomy = guards.taxonomy_of(guard)
    if guard == "granite_guardian":
        risks = call.categories or call.policies or (guards.DEFAULT_GRANITE_RISK,)
        unknown = [r for r in risks if r not in taxonomy.codes()]
        if unknown:
            raise InvalidRequestError(
                f"unknown Granite Guardian risk(s) {unknown}: expected of {list(taxonomy.codes())}"
            )
        prompts = []
        for i, c in enumerate(call.inputs):
            for risk in risks:
                text = guard_prompts.render_guard(
                    tokenizer, template, messages(c), guardian_config={"risk_name": risk}
                )
                prompts.append(Prompt(i, risk, guard_prompts.prompt_ids(tokenizer, text, True)))
        plan = plan_moderation("yes_no", prompts, len(call.inputs), encode, taxonomy)
        return guard, plan
    if call.policies:
        raise InvalidRequestError(
            f"{guard} checks its own categories: give `categories` (a subset of "
            f"{list(taxonomy.codes())}), not `policies`"
        )
    kwargs = {}
    if call.categories is not None:
        unknown = [c for c in call.categories if c not in taxonomy.codes()]
        if unknown:
            raise InvalidRequestError(
                f"unknown {guard} categories {unknown}: expected of {list(taxonomy.codes())}"
            )
        if guard == "llama_guard_3":
            if not guards.takes_categories(template):
                raise InvalidRequestError(
                    "this Llama Guard 3 checkpoint's template has its categories written in "
                    "(the 8B's): it cannot check a subset"
                )
            kwargs["excluded_category_keys"] = [
                c for c in taxonomy.codes() if c not in call.categories
            ]
    elif guard == "llama_guard_3" and guards.takes_categories(template):
        kwargs["excluded_category_keys"] = []
    prompts, codes = [], None
    for i, c in enumerate(call.inputs):
        text = guard_prompts.render_guard(tokenizer, template, messages(c), **kwargs)
        prompts.append(Prompt(i, None, guard_prompts.prompt_ids(tokenizer, text, True)))
        listed = (
            guards.listed_codes(taxonomy, text)
            if guard == "llama_guard_3"
            else guards.qwen3guard_codes(c)
        )
        if call.categories is not None:
            listed = tuple(x for x in listed if x in call.categories)
        codes = listed if codes is None else tuple(x for x in codes if x in listed)
    kind = "llama_guard_3" if guard == "llama_guard_3" else "qwen3guard"
    plan = plan_moderation(kind, prompts, len(call.inputs), encode, taxonomy, codes=codes)
    return guard, plan


def check_prompt_lengths(plan: ModerationPlan, limit: int) -> None:
    """InvalidRequestError naming the input whose prompt, with its longest verdict (and in
    a second round the verdict before the categories), is over `limit` tokens (the
    engine's longest scoring prompt: the context, with prefill-only KV)."""
    for round_ in plan.rounds:
        per_prompt = len(round_.items) // len(plan.prompts)
        label = max(len(ids) for ids in round_.labels)
        for k, item in enumerate(round_.items):
            n = len(round_.query) + len(item) + label
            if n > limit:
                prompt = plan.prompts[k // per_prompt]
                policy = f" (checking {prompt.policy!r})" if prompt.policy else ""
                raise InvalidRequestError(
                    f"input {prompt.input_index}{policy}: the guard's prompt and its verdict "
                    f"are {n} tokens, longer than the {limit} this engine accepts (shorten "
                    "the conversation, or raise context_length when starting the engine)"
                )
