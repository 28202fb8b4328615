"""Every SGLang symbol the project relies on still exists in the pinned SGLang."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points, version

import pytest

from prefillonly_sgl.sglang_runtime import SGLANG_VERSION
from prefillonly_sgl.sglang_runtime.hook_targets import HOOK_TARGETS


def test_sglang_version_is_the_pinned_one():
    assert version("sglang") == SGLANG_VERSION


def _resolve(dotted: str):
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("target", sorted(HOOK_TARGETS))
def test_hook_target_exists(target):
    assert _resolve(target) is not None


def test_server_state_carries_the_scheduler_info():
    import dataclasses

    from sglang.srt.entrypoints.http_server import _GlobalState

    assert "scheduler_info" in {f.name for f in dataclasses.fields(_GlobalState)}


def test_sglang_still_has_the_routes_serve_replaces():
    """`serve` removes SGLang's /v1/score, /v1/rerank, /v1/classify, /v1/chat/completions
    and /v1/completions routes and adds its own (http_server.install): each must still be
    there, once."""
    from fastapi.routing import APIRoute
    from sglang.srt.entrypoints.http_server import app

    from prefillonly_sgl.sglang_runtime.http_server import REPLACED_PATHS

    paths = [r.path for r in app.router.routes if isinstance(r, APIRoute)]
    for path in {"/v1/score", "/v1/chat/completions", "/v1/completions", *REPLACED_PATHS}:
        assert paths.count(path) == 1, path


def test_plugin_entry_point_is_installed():
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("prefillonly") == "prefillonly_sgl.sglang_runtime.plugin:load_plugin"


def test_plugin_is_inert_without_the_runtime_configuration(monkeypatch):
    from prefillonly_sgl import environment
    from prefillonly_sgl.runtime_config import WorkerConfig
    from prefillonly_sgl.sglang_runtime import plugin, process_state

    monkeypatch.delenv(environment.RUNTIME_CONFIG, raising=False)
    before = process_state.current().config
    plugin.load_plugin()  # stock SGLang: nothing read, nothing installed
    assert process_state.current().config is before
    assert WorkerConfig.from_environment() is None
    monkeypatch.setenv(environment.RUNTIME_CONFIG, '{"features": ["no-such-feature"]}')
    with pytest.raises(ValueError, match="no-such-feature"):
        WorkerConfig.from_environment()


def test_every_hook_table_target_is_listed():
    """Each feature's hook tables (hooks.py) name only symbols in HOOK_TARGETS, so the
    resolution test above covers them; and each table's hook types exist."""
    from sglang.srt.plugins.hook_registry import HookType

    from prefillonly_sgl.sglang_runtime import (
        offline_engine,
        reusable_prefix,
        single_token,
        tokenizer_endpoints,
    )
    from prefillonly_sgl.sglang_runtime.forward_profile import scheduler_process as profile
    from prefillonly_sgl.sglang_runtime.hybrid_prefill import scheduler_process as hybrid
    from prefillonly_sgl.sglang_runtime.jct_scheduler import scheduler_process as jct
    from prefillonly_sgl.sglang_runtime.memory_probe import scheduler_process as probe
    from prefillonly_sgl.sglang_runtime.prefill_kv import scheduler_process as kv

    tables = [
        offline_engine.SHUTDOWN_HOOKS,
        kv.HOOKS,
        reusable_prefix.HOOKS,
        single_token.HOOKS,
        single_token.AFTER_HOOKS,
        tokenizer_endpoints.HOOKS,
        jct.HOOKS,
        hybrid.HOOKS,
        probe.HOOKS,
        profile.HOOKS,
    ]
    for table in tables:
        for target, (hook_type, hook) in table.items():
            assert target in HOOK_TARGETS, target
            assert HookType[hook_type] and callable(hook)


def test_every_feature_names_a_register_function_that_exists():
    import importlib

    from prefillonly_sgl import features

    for feature in features.FEATURES.values():
        module_name, function_name = feature.register.split(":")
        assert callable(getattr(importlib.import_module(module_name), function_name)), feature
