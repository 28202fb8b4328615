"""The feature registry, and the features themselves: one folder per row (plain Python
here, no SGLang).

A feature has one row in FEATURES: its name (``Engine.features``, ``serve --features``),
its Engine switch, its ``serve`` flag, its options (Engine argument and flag each), the
class of its resolved settings, the function that installs its hooks in an SGLang process
and the features it needs. The Engine's arguments, serve's flags, the worker configuration
(config/runtime_config.py) and the plugin's install loop (sglang_runtime/plugin.py) are all read
from this table, so adding a feature is a row here plus its folder (ARCHITECTURE.md,
"Adding a feature").

The row's name is its folder's and its docs'. A folder holds the feature's plain
decisions (testable without SGLang) beside its SGLang modules, named for the process they
run in (`scheduler_process.py`, `scheduler_torch_backend.py`, ...), and its `register()`
(the row's "register"), which imports the SGLang modules only when the plugin calls it:

    prefill_attention/   attention of the new tokens only      docs/prefill_attention.md
    prefill_kv/          pool KV for the reusable prefix only   docs/prefill_only_kv.md
    jct_scheduler/       shortest predicted job first            docs/scheduler.md
    hybrid_prefill/      long prompts in chunks                  docs/hybrid_prefill.md
    prompt_logprobs/     echo logprobs through the prefix cache  docs/loglikelihood.md
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any


def positive_int(value) -> int:
    """An option's converter: an int > 0 (from an int, or a flag's text)."""
    number = int(value)
    if number <= 0 or (isinstance(value, float) and value != number):
        raise ValueError(f"must be a positive integer, got {value!r}")
    return number


@dataclass(frozen=True)
class Option:
    """A setting of one feature: an Engine argument and a `serve` flag."""

    engine_arg: str
    flag: str
    help: str
    type: Callable[[Any], Any] = str  # converts the flag's text (and checks Engine values)
    metavar: str | None = None
    choices: tuple[str, ...] | None = None


def _bool_switch(value) -> bool | None:
    """An Engine switch: True asks for the feature (an error if it cannot have it), False
    switches it off, None leaves it at its default (on, unless a dependency is off)."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"must be True, False or None, got {value!r}")


@dataclass(frozen=True)
class Feature:
    name: str  # in Engine.features, serve --features, the worker configuration
    engine_arg: str  # the Engine's switch
    summary: str
    # "module:function()" installing its SGLang hooks in a process; the hooks read the
    # feature's settings from sglang_runtime/process_state.py.
    register: str
    # `serve`'s flag switching it off (None: another serve option switches it).
    disable_flag: str | None = None
    # The Engine switch's value -> True / False / None (see _bool_switch).
    switch: Callable[[Any], bool | None] = _bool_switch
    engine_default: Any = None  # the switch's default in Engine(...)
    off_value: Any = False  # the switch's value for stock SGLang (STOCK_SGLANG)
    options: tuple[Option, ...] = ()
    # "module:Class" of its settings: a frozen dataclass with resolve(context, **options),
    # to_dict and from_dict, resolved once per engine and shipped to the workers ("": none).
    settings: str = ""
    needs: tuple[str, ...] = ()
    why_needed: str = ""
    # Reads each score prompt's reusable-prefix length, which the tokenizer process
    # attaches (prefill_kv/tokenizer_process.py) for features that say so.
    reads_reusable_len: bool = False


JCT_POLICY = "jct"  # schedule_policy / --schedule-policy: the JCT scheduler (the default)


def _jct_switch(policy) -> bool | None:
    """schedule_policy: "jct" is the JCT scheduler; SGLang's policies switch it off."""
    if not isinstance(policy, str) or not policy:
        raise TypeError(f"must be a policy name, got {policy!r}")
    return None if policy == JCT_POLICY else False


# In the order they are applied.
FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "prefill_attention",
            "prefill_only_attention",
            "attention of new tokens only (a cache hit skips the prefix)",
            "prefillonly_sgl.features.prefill_attention:register",
            disable_flag="--disable-prefill-only-attention",
        ),
        Feature(
            "prefill_kv",
            "prefill_only_kv",
            "scoring requests keep pool KV only for their reusable prefix",
            "prefillonly_sgl.features.prefill_kv:register",
            disable_flag="--disable-prefill-only-kv",
            needs=("prefill_attention",),
            why_needed="stock attention reads the new tokens back from the KV pool, where "
            "prefill_kv no longer writes them",
            reads_reusable_len=True,
        ),
        Feature(
            "jct_scheduler",
            "schedule_policy",
            "shortest remaining job first on a job-time model, with aging and prefix groups",
            "prefillonly_sgl.features.jct_scheduler:register",
            switch=_jct_switch,
            engine_default=JCT_POLICY,
            off_value="fcfs",
            options=(
                Option(
                    "jct_aging",
                    "--jct-aging",
                    "JCT scheduler: seconds of priority a request gains per second waited "
                    "(default 1.0)",
                    float,
                    "LAMBDA",
                ),
                Option(
                    "jct_profile",
                    "--jct-profile",
                    "JCT scheduler: a profile from `prefillonly profile` (default: the saved "
                    "one for this model, device, dtype and features, else the built-in one)",
                    str,
                    "FILE",
                ),
                Option(
                    "jct_eviction",
                    "--jct-eviction",
                    "JCT scheduler: 'queue' (default) keeps the cached prefixes waiting "
                    "requests will hit longest and runs those hits before a batch evicts "
                    "them; 'lru': SGLang's least-recently-used eviction (docs/scheduler.md)",
                    str,
                    choices=(
                        "queue",
                        "lru",
                    ),  # features/jct_scheduler/eviction.py: EVICTION_POLICIES
                ),
                Option(
                    "jct_batch_tokens",
                    "--jct-batch-tokens",
                    "JCT scheduler: new tokens per batch of whole scoring prompts, up to "
                    "max_prefill_tokens (default: max_prefill_tokens on CUDA, 16384 unless "
                    "set; elsewhere stock's min(max_prefill_tokens, chunked_prefill_size))",
                    positive_int,
                    "TOKENS",
                ),
            ),
            settings="prefillonly_sgl.features.jct_scheduler.settings:JctSettings",
            reads_reusable_len=True,
        ),
        Feature(
            "hybrid_prefill",
            "hybrid_prefill",
            "long prompts run in chunks: whole decoder layers in query chunks (mode layer) "
            "or the token-wise modules only (mode token)",
            "prefillonly_sgl.features.hybrid_prefill:register",
            disable_flag="--disable-hybrid-prefill",
            options=(
                Option(
                    "hybrid_prefill_chunk_size",
                    "--hybrid-prefill-chunk-size",
                    "hybrid prefilling: tokens per chunk of a long prompt (default: mode "
                    "layer cpu 1024, mode token cpu 2048, cuda 4096; docs/hybrid_prefill.md)",
                    positive_int,
                    "TOKENS",
                ),
                Option(
                    "hybrid_prefill_whole_up_to",
                    "--hybrid-prefill-whole-up-to",
                    "hybrid prefilling: forwards of at most this many tokens run whole "
                    "(default: the largest batch stock SGLang builds, min(max_prefill_tokens, "
                    "chunked_prefill_size), or the chunk size when one is given)",
                    positive_int,
                    "TOKENS",
                ),
                Option(
                    "hybrid_prefill_mode",
                    "--hybrid-prefill-mode",
                    "hybrid prefilling: 'layer' (default) runs whole decoder layers in query "
                    "chunks, only the residual stream and one layer's K/V whole; 'token' "
                    "chunks only the MLPs, norms and rotary embeddings",
                    str,
                    choices=("layer", "token"),
                ),
            ),
            settings="prefillonly_sgl.features.hybrid_prefill.settings:HybridSettings",
        ),
        Feature(
            "prompt_logprobs",
            "prompt_logprob_cache",
            "echo + logprobs requests reuse the prefix cache: each cached token keeps its "
            "prompt logprob and top-k; logprobs computed in chunks",
            "prefillonly_sgl.features.prompt_logprobs:register",
            disable_flag="--disable-prompt-logprob-cache",
            options=(
                Option(
                    "prompt_logprob_chunk_size",
                    "--prompt-logprob-chunk-size",
                    "prompt logprobs: positions whose logits exist at once (default 512; "
                    "docs/loglikelihood.md)",
                    positive_int,
                    "TOKENS",
                ),
            ),
            settings="prefillonly_sgl.features.prompt_logprobs.settings:PromptLogprobSettings",
        ),
    )
}

# Engine argument -> (feature, option): every feature option the Engine accepts.
OPTIONS: dict[str, tuple[Feature, Option]] = {
    option.engine_arg: (feature, option)
    for feature in FEATURES.values()
    for option in feature.options
}

# Engine(model, **STOCK_SGLANG): SGLang as it ships, every runtime feature off (A/B runs).
STOCK_SGLANG: dict[str, Any] = {f.engine_arg: f.off_value for f in FEATURES.values()}


def reads_reusable_len(names) -> bool:
    """Whether the tokenizer process must attach reusable-prefix lengths for `names`."""
    return any(FEATURES[name].reads_reusable_len for name in names)


def check_known(names: Iterable[str], what: str = "runtime features") -> list[str]:
    names = list(names)
    unknown = [name for name in names if name not in FEATURES]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {list(FEATURES)}")
    return names


def parse_names(text: str) -> list[str]:
    """A comma-separated list of feature names ('' for none), checked."""
    return check_known([name.strip() for name in text.split(",") if name.strip()])


def select_features(
    requested: Iterable[str] | None = None,
    disabled: Iterable[str] = (),
    insisted: Iterable[str] = (),
    name_of=lambda name: name,
    unavailable: Mapping[str, str] | None = None,
) -> list[str]:
    """The features to apply, in FEATURES order.

    requested: the features asked for by name (None: every feature, the default).
    disabled: switched off. A default feature whose dependency is switched off goes with
        it (turning prefill-only attention off turns prefill-only KV off too).
    insisted: features the caller asked for explicitly (a name in `requested` counts too):
        one whose dependency is off is an error (ValueError naming why), never dropped.
    name_of: how the caller's user calls a feature (the Engine: its argument names).
    unavailable: {feature: why} this model cannot run (its family, models/families.py): off like
        a disabled one, and an error (ValueError naming why) where insisted on.
    """
    explicit = requested is not None
    chosen = check_known(FEATURES if requested is None else requested)
    off = set(check_known(disabled))
    insisted = set(check_known(insisted)) | (set(chosen) if explicit else set())
    for name, why in (unavailable or {}).items():
        if name in insisted and name not in off:
            raise ValueError(f"{name_of(name)}: {why}")
        off.add(name)
    selected = {name for name in chosen if name not in off} | (insisted - off)
    for name in FEATURES:  # dependencies come first in FEATURES: one pass settles them
        feature = FEATURES[name]
        missing = [need for need in feature.needs if need not in selected]
        if name in selected and missing:
            if name in insisted:
                needs = ", ".join(name_of(need) for need in missing)
                raise ValueError(f"{name_of(name)} needs {needs} ({feature.why_needed})")
            selected.discard(name)
    return [name for name in FEATURES if name in selected]


def choose_features(
    requested: Iterable[str] | None = None,
    switches: Mapping[str, Any] | None = None,
    name_of=lambda name: FEATURES[name].engine_arg,
    unavailable: Mapping[str, str] | None = None,
) -> list[str]:
    """The features of a request: `requested` by name (None: every feature) and the
    Engine's switches ({engine_arg: value}, absent: default; Feature.switch says what a
    value means). name_of: how errors name a feature (default: its Engine argument).
    unavailable: as select_features'."""
    disabled, insisted = [], []
    for feature in FEATURES.values():
        value = (switches or {}).get(feature.engine_arg, feature.engine_default)
        try:
            state = feature.switch(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{name_of(feature.name)} {e}") from None
        if state is False:
            disabled.append(feature.name)
        elif state is True:
            insisted.append(feature.name)
    return select_features(requested, disabled, insisted, name_of, unavailable)
