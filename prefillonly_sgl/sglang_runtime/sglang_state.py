"""SGLang's private state outside its hooks: each private attribute of an SGLang object
that our code reads or writes, through one function here.

Private *methods* we call or hook are resolvable on their class and listed in
hook_targets.HOOK_TARGETS. The attributes below are instance data (set in an ``__init__``,
by a decorator or by ``prepare_server_args``), which a class lookup cannot resolve: they
are listed in hook_targets.PRIVATE_ATTRIBUTES with the module that reads them, and
tests/test_sglang_hook_targets.py checks that SGLang's code still sets each where listed
and that no other module of ours names it. Where SGLang has a public way (the LoRA
registry's ``get_all_adapters``, the ``auth_level`` decorator), it is used instead.
"""

from __future__ import annotations


def loaded_adapter_names(tokenizer_manager) -> frozenset[str]:
    """The LoRA adapters loaded now, by name (SGLang's public LoRARegistry.get_all_adapters;
    a tokenizer manager without a registry has none)."""
    registry = getattr(tokenizer_manager, "lora_registry", None)
    return frozenset(registry.get_all_adapters()) if registry is not None else frozenset()


def subprocess_watchdog(tokenizer_manager):
    """SGLang's SubprocessWatchdog of an engine's workers (TokenizerManager's
    ``_subprocess_watchdog``, set by the Engine after start), or None."""
    return getattr(tokenizer_manager, "_subprocess_watchdog", None)


def auth_level(endpoint):
    """The auth level SGLang's API-key middleware reads from a route's endpoint function
    (its ``_auth_level``, set by SGLang's ``auth_level`` decorator), or None: normal."""
    return getattr(endpoint, "_auth_level", None)


def set_auth_level(endpoint, level):
    """Gives an endpoint function SGLang's auth level ``level`` (an AuthLevel) with SGLang's
    own decorator; returns it."""
    from sglang.srt.utils.auth import auth_level as sglang_auth_level

    return sglang_auth_level(level)(endpoint)


def mark_radix_eviction_policy_given(raw_args, given: bool) -> None:
    """What prepare_server_args records on the parsed flags before building ServerArgs
    (``_radix_eviction_policy_explicitly_set``): whether --radix-eviction-policy was on
    the command line."""
    raw_args._radix_eviction_policy_explicitly_set = given


def record_launch_command(server_args, command) -> None:
    """What prepare_server_args keeps on ServerArgs after building it (``_launch_command``,
    read back through its public ``launch_command``): the command line, redacted."""
    server_args._launch_command = command
