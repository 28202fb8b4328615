"""The one runtime configuration (prefillonly_sgl/config/runtime_config.py), SGLang only for its
flag parser: the Engine's arguments and serve's flags resolve by the same rules to the same
configuration, errors name what the user typed, and the workers' part survives its trip as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.config.runtime_config import BUDGET_MEM_FRACTION_STATIC, WorkerConfig
from prefillonly_sgl.features import FEATURES, OPTIONS, STOCK_SGLANG
from prefillonly_sgl.machine import environment
from prefillonly_sgl.server.options import parse_serve_argv, serve_config, server_flags


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path / "cache"))  # no saved profiles
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "torch_dtype": "float32"})
    )
    return str(folder)


def _engine(model, **kwargs):
    defaults = dict(device="cpu", dtype="auto", max_total_tokens=None, context_length=None,
                    memory_budget=None, max_prompt_tokens=None)  # fmt: skip
    return runtime_config.from_engine_args(model, **{**defaults, **kwargs})


def _serve(model, *argv):
    from prefillonly_sgl.sglang_runtime.server_flags import parse_flags  # SGLang's parser

    options, sglang_argv = parse_serve_argv(["--model-path", model, "--device", "cpu", *argv])
    flags = parse_flags(sglang_argv)
    return serve_config(options, flags), flags


@pytest.mark.parametrize(
    "engine_kwargs, flags",
    [
        ({}, []),
        (dict(prefill_only_attention=False), ["--disable-prefill-only-attention"]),
        (dict(prefill_only_kv=False), ["--disable-prefill-only-kv"]),
        (dict(schedule_policy="lpm"), ["--schedule-policy", "lpm"]),
        (dict(jct_aging=0.25), ["--jct-aging", "0.25"]),
        (
            dict(hybrid_prefill_chunk_size=256, hybrid_prefill_mode="token"),
            ["--hybrid-prefill-chunk-size", "256", "--hybrid-prefill-mode", "token"],
        ),
        (dict(hybrid_prefill=False), ["--disable-hybrid-prefill"]),
        (dict(STOCK_SGLANG), ["--features", ""]),
        (dict(max_total_tokens=4096), ["--max-total-tokens", "4096"]),
    ],
)
def test_engine_arguments_and_serve_flags_make_the_same_configuration(model, engine_kwargs, flags):
    from_engine, sglang_args = _engine(model, **engine_kwargs)
    from_serve, _ = _serve(model, *flags)
    assert sglang_args == {}
    if engine_kwargs == STOCK_SGLANG:  # serve's --features '' leaves SGLang's policy as is
        from_serve = runtime_config.dataclasses.replace(from_serve, schedule_policy="fcfs")
    assert from_engine == from_serve


def test_the_workers_part_travels_as_json_and_back(model):
    config, _ = _engine(model, jct_aging=0.5, hybrid_prefill_chunk_size=128)
    environ = config.environment()
    assert list(environ) == [environment.RUNTIME_CONFIG]
    worker = WorkerConfig.from_environment(environ)
    assert worker == config.worker
    assert worker.settings["jct_scheduler"].aging == 0.5
    assert worker.settings["hybrid_prefill"].chunk_size == 128
    assert WorkerConfig.from_environment({}) is None


def test_features_options_apply_only_with_their_feature_in_the_users_words(model):
    with pytest.raises(ValueError, match="jct_aging / jct_profile apply with schedule_policy jct"):
        _engine(model, schedule_policy="fcfs", jct_aging=2.0, jct_profile="p.json")
    with pytest.raises(ValueError, match="--jct-aging applies with --schedule-policy jct"):
        _serve(model, "--schedule-policy", "fcfs", "--jct-aging", "2")
    with pytest.raises(ValueError, match="hybrid_prefill_chunk_size applies with hybrid_prefill"):
        _engine(model, hybrid_prefill=False, hybrid_prefill_chunk_size=64)
    with pytest.raises(ValueError, match="--hybrid-prefill-mode applies with hybrid_prefill on"):
        _serve(model, "--disable-hybrid-prefill", "--hybrid-prefill-mode", "token")
    with pytest.raises(ValueError, match="prefill_only_kv needs prefill_only_attention"):
        _engine(model, prefill_only_attention=False, prefill_only_kv=True)
    with pytest.raises(ValueError, match="prefill_kv needs prefill_attention"):
        _serve(model, "--features", "prefill_kv")


def test_memory_budget_rules_in_one_place(model):
    with pytest.raises(ValueError, match="give memory_budget or max_total_tokens, not both"):
        _engine(model, memory_budget="1GiB", max_total_tokens=4096)
    with pytest.raises(ValueError, match="--memory-budget or --max-total-tokens, not both"):
        _serve(model, "--memory-budget", "1GiB", "--max-total-tokens", "4096")
    with pytest.raises(ValueError, match="max_prompt_tokens applies with memory_budget"):
        _engine(model, max_prompt_tokens=1000)
    with pytest.raises(ValueError, match="--max-prompt-tokens applies with --memory-budget"):
        _serve(model, "--max-prompt-tokens", "1000")
    config, _ = _engine(model, memory_budget="1GiB", max_prompt_tokens=2048)
    assert config.memory == runtime_config.MemoryRequest(1 << 30, 2048)
    assert "mem_fraction_static" not in config.sglang_defaults()  # cpu
    cuda, _ = _engine(model, device="cuda", memory_budget="1GiB")
    assert cuda.sglang_defaults()["mem_fraction_static"] == BUDGET_MEM_FRACTION_STATIC
    # prefill CUDA graphs never capture a batch hybrid prefilling would run in chunks:
    # by default only forwards past the scheduler's largest batch chunk; the JCT
    # scheduler's batches of whole scoring prompts reach max_prefill_tokens on CUDA
    # (jct_scheduler/batch_budget.py), so the buckets follow them (SGLang's own stay
    # under stock's policy); an explicit limit (or chunk size) caps the buckets at it
    assert _engine(model, device="cuda")[0].sglang_defaults()["cuda_graph_max_bs_prefill"] == 16384
    stock_policy = _engine(model, device="cuda", schedule_policy="lpm")[0]
    assert "cuda_graph_max_bs_prefill" not in stock_policy.sglang_defaults()
    # under a budget every forward past a chunk chunks, as its measurement assumes
    assert cuda.settings("hybrid_prefill").whole_up_to == 2048
    assert cuda.sglang_defaults()["cuda_graph_max_bs_prefill"] == 2048
    explicit, _ = _engine(model, device="cuda", hybrid_prefill_chunk_size=1024)
    assert explicit.sglang_defaults()["cuda_graph_max_bs_prefill"] == 1024
    limit, _ = _engine(model, device="cuda", hybrid_prefill_whole_up_to=3000)
    assert limit.sglang_defaults()["cuda_graph_max_bs_prefill"] == 3000
    token_mode, _ = _engine(
        model, device="cuda", hybrid_prefill_mode="token", hybrid_prefill_whole_up_to=512
    )
    assert token_mode.sglang_defaults()["cuda_graph_max_bs_prefill"] == 512


def test_sglang_arguments_from_one_configuration(model):
    config, sglang_args = _engine(model, mem_fraction_static=0.5, context_length=4096)
    assert sglang_args == {"mem_fraction_static": 0.5}  # not ours: to SGLang unchanged
    fields = config.sglang_fields()
    assert fields["schedule_policy"] == "fcfs"  # the JCT policy runs on FCFS underneath
    assert fields["dtype"] == "float32"  # cpu "auto": the folder's own
    assert fields["context_length"] == 4096 and "max_total_tokens" not in fields
    assert config.sglang_defaults()["max_total_tokens"] == 16384
    lpm, _ = _engine(model, schedule_policy="lpm")
    assert lpm.sglang_fields()["schedule_policy"] == "lpm" and lpm.settings("jct_scheduler") is None
    # serve: the same fields as flags, never over a flag the user gave
    config, flags = _serve(model, "--attention-backend", "triton", "--schedule-policy", "lpm")
    values = server_flags(config, flags).values
    assert values["attention_backend"] == "triton"
    assert values["schedule_policy"] == "lpm"
    assert values["sleep_on_idle"] and values["enable_metrics"]
    assert not server_flags(config, flags, metrics=False).values["enable_metrics"]


def test_every_feature_option_has_an_engine_argument_and_a_serve_flag(model):
    options, _ = parse_serve_argv([])
    assert options.feature_options == {}
    for feature, option in OPTIONS.values():
        assert option.flag.startswith("--") and feature.name in FEATURES
    flags = [f.disable_flag for f in FEATURES.values() if f.disable_flag]
    options, _ = parse_serve_argv(flags)
    assert set(options.disabled) == {f.name for f in FEATURES.values() if f.disable_flag}
    with pytest.raises(ValueError, match="unknown option"):
        runtime_config.resolve(model, device="cpu", options={"warp": 1})


def test_a_missing_model_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="model folder not found"):
        _engine(str(tmp_path / "nope"))


def test_every_prefillonly_variable_is_named_in_environment_py():
    """machine/environment.py is the whole list: no other module defines a PREFILLONLY_ variable's
    name, and every one the sources or docs mention is in the list."""
    import ast
    import re
    from pathlib import Path

    root = Path(environment.__file__).parents[1]  # the package
    # An app attribute, a mark inside prompts, the GPU test's and the suite's servers' own
    # switches (tests/: test_gpu_engine.py, forked_server.py).
    not_variables = {"PREFILLONLY_ENDPOINTS", "PREFILLONLY_ITEM", "PREFILLONLY_GPU_TEST_DEVICE",
                     "PREFILLONLY_TEST_SERVERS"}  # fmt: skip
    mentioned = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        mentioned |= set(re.findall(r"PREFILLONLY_[A-Z_]+", text))
        if path == Path(environment.__file__):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = re.fullmatch(r"PREFILLONLY_[A-Z_]+", node.value)
                assert not named or node.value in not_variables, f"{path}: {node.value}"
    for path in [*root.parent.glob("*.md"), *(root.parent / "docs").glob("*.md")]:
        mentioned |= set(re.findall(r"PREFILLONLY_[A-Z_]+", path.read_text()))
    assert mentioned - not_variables <= set(environment.VARIABLES)
    with pytest.raises(KeyError, match="not one of prefillonly's"):
        environment.read("PREFILLONLY_NOPE")


def test_a_vision_language_model_has_sglangs_image_preprocess_cache_with_our_features(model):
    """A score call's prompts carry the query's image each; SGLang's preprocess cache (off
    by default for Qwen2.5-VL) processes it once. Stock SGLang stays as shipped."""
    config = json.loads((Path(model) / "config.json").read_text())
    config["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
    (Path(model) / "config.json").write_text(json.dumps(config))
    ours, _ = _engine(model)
    assert ours.sglang_defaults()["mm_preprocess_cache_size_mb"] > 0
    stock, _ = _engine(model, **STOCK_SGLANG)
    assert "mm_preprocess_cache_size_mb" not in stock.sglang_defaults()
    # the user's own value wins over the default, as for every SGLang default
    _, flags = _serve(model, "--mm-preprocess-cache-size-mb", "0")
    assert server_flags(ours, flags).values["mm_preprocess_cache_size_mb"] == 0
