"""The runtime features prefillonly applies to SGLang, and which one needs which (plain
Python). The Engine's switches and `serve`'s flags both resolve here, so the rules have
one owner; each feature also names the function that installs it in an SGLang process
("module:function", imported only there), which sglang_runtime/plugin.py calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str  # in PREFILLONLY_PATCHES and `serve --patches`
    engine_arg: str  # the Engine's switch
    summary: str
    register: str  # "module:function" registering its SGLang hooks in the calling process
    needs: tuple[str, ...] = ()
    why_needed: str = ""
    # Reads each score prompt's reusable-prefix length, which the tokenizer process
    # attaches (sglang_runtime/reusable_prefix.py) for features that say so.
    reads_reusable_len: bool = False


# In the order they are applied.
FEATURES: dict[str, Feature] = {
    f.name: f
    for f in (
        Feature(
            "prefill_attention",
            "prefill_only_attention",
            "attention of new tokens only (a cache hit skips the prefix)",
            "prefillonly_sgl.sglang_runtime.prefill_attention:register",
        ),
        Feature(
            "prefill_kv",
            "prefill_only_kv",
            "scoring requests keep pool KV only for their reusable prefix",
            "prefillonly_sgl.sglang_runtime.prefill_kv:register",
            needs=("prefill_attention",),
            why_needed="stock attention reads the new tokens back from the KV pool, where "
            "prefill_kv no longer writes them",
            reads_reusable_len=True,
        ),
        Feature(
            "jct_scheduler",
            "schedule_policy",
            "shortest remaining job first on a job-time model, with aging and prefix groups",
            "prefillonly_sgl.sglang_runtime.jct_scheduler:register",
            reads_reusable_len=True,
        ),
        Feature(
            "hybrid_prefill",
            "hybrid_prefill",
            "long prompts run in chunks: whole decoder layers in query chunks (mode layer) "
            "or the token-wise modules only (mode token)",
            "prefillonly_sgl.sglang_runtime.hybrid_prefill:register",
        ),
    )
}


def reads_reusable_len(names) -> bool:
    """Whether the tokenizer process must attach reusable-prefix lengths for `names`."""
    return any(FEATURES[name].reads_reusable_len for name in names)


def check_known(names: Iterable[str], what: str = "runtime features") -> list[str]:
    names = list(names)
    unknown = [name for name in names if name not in FEATURES]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {list(FEATURES)}")
    return names


def select_features(
    requested: Iterable[str] | None = None,
    disabled: Iterable[str] = (),
    insisted: Iterable[str] = (),
    name_of=lambda name: name,
) -> list[str]:
    """The features to apply, in FEATURES order.

    requested: the features asked for by name (None: every feature, the default).
    disabled: switched off. A default feature whose dependency is switched off goes with
        it (turning prefill-only attention off turns prefill-only KV off too).
    insisted: features the caller asked for explicitly (a name in `requested` counts too):
        one whose dependency is off is an error (ValueError naming why), never dropped.
    name_of: how the caller's user calls a feature (the Engine: its argument names).
    """
    explicit = requested is not None
    chosen = check_known(FEATURES if requested is None else requested)
    off = set(check_known(disabled))
    insisted = set(check_known(insisted)) | (set(chosen) if explicit else set())
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


def engine_features(
    prefill_only_attention: bool,
    prefill_only_kv: bool | None,
    jct_scheduler: bool = True,
    hybrid_prefill: bool = True,
) -> list[str]:
    """The Engine's switches (prefill_only_kv=None: follows prefill_only_attention;
    jct_scheduler: its schedule_policy is "jct")."""
    disabled = [] if prefill_only_attention else ["prefill_attention"]
    if prefill_only_kv is False:
        disabled.append("prefill_kv")
    if not jct_scheduler:
        disabled.append("jct_scheduler")
    if not hybrid_prefill:
        disabled.append("hybrid_prefill")
    return select_features(
        None,
        disabled,
        insisted=["prefill_kv"] if prefill_only_kv else [],
        name_of=lambda name: FEATURES[name].engine_arg,
    )
