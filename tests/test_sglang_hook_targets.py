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
    """`serve` removes SGLang's /v1/score, /v1/rerank, /v1/classify, /v1/decisions,
    /v1/systemone, /v1/models, /v1/chat/completions and /v1/completions routes and adds
    its own (http_server.install): each must still be there, once."""
    from fastapi.routing import APIRoute
    from sglang.srt.entrypoints.http_server import app

    from prefillonly_sgl.sglang_runtime.http_server import REPLACED_PATHS

    paths = [r.path for r in app.router.routes if isinstance(r, APIRoute)]
    ours = {"/v1/score", "/v1/models", "/v1/chat/completions", "/v1/completions"}
    for path in {*ours, *REPLACED_PATHS}:
        assert paths.count(path) == 1, path


def test_plugin_entry_point_is_installed():
    names = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert names.get("prefillonly") == "prefillonly_sgl.sglang_runtime.plugin:load_plugin"


def test_plugin_is_inert_without_the_runtime_configuration(monkeypatch):
    from prefillonly_sgl.config.runtime_config import WorkerConfig
    from prefillonly_sgl.hooking import process_state
    from prefillonly_sgl.machine import environment
    from prefillonly_sgl.sglang_runtime import plugin

    monkeypatch.delenv(environment.RUNTIME_CONFIG, raising=False)
    before = process_state.current().config
    plugin.load_plugin()  # stock SGLang: nothing read, nothing installed
    assert process_state.current().config is before
    assert WorkerConfig.from_environment() is None
    monkeypatch.setenv(environment.RUNTIME_CONFIG, '{"features": ["no-such-feature"]}')
    with pytest.raises(ValueError, match="no-such-feature"):
        WorkerConfig.from_environment()


def hook_tables() -> dict[str, dict]:
    """Every hook table (hooks.py: a module-level dict named *HOOKS) in the modules under
    sglang_runtime/ and features/, found by importing them all: none is left out by hand."""
    import pkgutil

    import prefillonly_sgl.features as features
    import prefillonly_sgl.sglang_runtime as runtime

    tables = {}
    for package in (runtime, features):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if name.endswith("HOOKS") and isinstance(value, dict):
                    tables[f"{info.name}.{name}"] = value
    return tables


def test_every_hook_table_target_is_listed():
    """Each feature's hook tables name only symbols in HOOK_TARGETS, so the resolution
    test above covers them; and each table's hook types exist."""
    from sglang.srt.plugins.hook_registry import HookType

    tables = hook_tables()
    assert "prefillonly_sgl.features.prompt_logprobs.scheduler_process.HOOKS" in tables
    assert len(tables) >= 11
    for name, table in tables.items():
        for target, (hook_type, hook) in table.items():
            assert target in HOOK_TARGETS, f"{name}: {target}"
            assert HookType[hook_type] and callable(hook)


def test_every_feature_names_a_register_function_that_exists():
    import importlib

    from prefillonly_sgl import features

    for feature in features.FEATURES.values():
        module_name, function_name = feature.register.split(":")
        assert callable(getattr(importlib.import_module(module_name), function_name)), feature


def _names(attribute: str):
    """`attribute` named as one: `x._name` or the string "_name" (not `_name_more`)."""
    import re

    return re.compile(rf"""[."']{re.escape(attribute)}\b""")


def test_private_attributes_are_still_set_where_listed():
    """SGLang's private instance attributes we read or write (hook_targets.PRIVATE_ATTRIBUTES):
    the SGLang code named for each still sets it, under that name."""
    import inspect

    from prefillonly_sgl.sglang_runtime.hook_targets import PRIVATE_ATTRIBUTES

    assert PRIVATE_ATTRIBUTES
    for entry, (module, why) in PRIVATE_ATTRIBUTES.items():
        owner, attribute = entry.rsplit(".", 1)
        source = inspect.getsource(_resolve(owner))
        assert f".{attribute} = " in source, entry
        assert importlib.import_module(module) and why


def test_each_private_attribute_is_named_by_one_module_of_ours():
    """No module of prefillonly_sgl names a listed private SGLang attribute but the one its
    entry names (sglang_state.py, its accessors), so an SGLang change is one place to fix."""
    from pathlib import Path

    import prefillonly_sgl
    from prefillonly_sgl.sglang_runtime.hook_targets import PRIVATE_ATTRIBUTES

    root = Path(prefillonly_sgl.__file__).parent
    sources = {
        "prefillonly_sgl." + ".".join(path.relative_to(root).with_suffix("").parts): path
        for path in root.rglob("*.py")
    }
    for entry, (owner_module, _) in PRIVATE_ATTRIBUTES.items():
        pattern = _names(entry.rsplit(".", 1)[1])
        naming = {
            module
            for module, path in sources.items()
            # the list itself (hook_targets.py and its two parts) names them
            if not module.endswith("hook_targets") and pattern.search(path.read_text())
        }
        assert naming == {owner_module}, entry
