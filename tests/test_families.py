"""The model-family registry and its rules in the configuration (plain Python, no SGLang):
which family a folder is, what its kinds of layer cannot run, and how resolve switches
those features off (with the reason), refuses them when asked for explicitly, and lets an
unknown architecture start with a warning."""

from __future__ import annotations

import json

import pytest

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.features import FEATURES
from prefillonly_sgl.models import config_fields, families, verified_architectures
from prefillonly_sgl.models.families import FAMILIES, LAYER_KINDS, LAYER_MODE, family_of


def _folder(tmp_path, architectures, **extra):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": architectures, **extra}))
    return tmp_path


def test_every_architecture_belongs_to_one_family():
    seen = {}
    for family in FAMILIES.values():
        assert family.architectures, family.name
        for arch in family.architectures:
            assert arch not in seen, f"{arch} in {seen.get(arch)} and {family.name}"
            seen[arch] = family.name
            assert family_of([arch]) is family
    assert family_of(["SomethingNewForCausalLM"]) is None
    assert family_of([]) is None and family_of(None) is None
    # The first architecture the table knows wins; a plain string is one architecture.
    assert family_of(["Unknown", "Qwen3ForCausalLM"]).name == "qwen3"
    assert family_of("Gemma3ForConditionalGeneration").name == "gemma3"


def test_conditional_generation_checkpoints_are_their_text_family():
    assert family_of(["Qwen3_5ForConditionalGeneration"]).name == "qwen3_5"
    assert family_of(["Qwen3_5MoeForConditionalGeneration"]).name == "qwen3_5_moe"


def test_features_off_come_from_the_kinds_of_layer():
    for family in FAMILIES.values():
        expected = {}
        for kind in family.layers:
            for key, why in LAYER_KINDS[kind].off.items():
                expected.setdefault(key, why)
        expected.update({k: v for k, v in family.own_off.items() if k not in expected})
        assert family.features_off() == expected
        for key in family.features_off():
            assert key.split(":")[0] in FEATURES, key
    # Full attention runs everything, whatever the decoder layer's shape: whole-layer
    # chunks run the layer's own forward (issue 62).
    for name in ("llama", "phi3", "qwen3", "qwen3_moe", "granite", "olmo2", "glm4", "gpt_oss"):
        assert FAMILIES[name].features_off() == {}, name
    # A sliding window: the prefill-only attention runs it (window applied), in query
    # chunks too, so it costs Gemma 3 nothing.
    assert FAMILIES["gemma3"].features_off() == {}
    # A recurrent layer carries state along the sequence: no whole-layer chunks. Every
    # kind of recurrent layer has the same rules (one mechanism: _recurrent_kind).
    assert "carries a state" in FAMILIES["qwen3_next"].features_off()[LAYER_MODE]
    recurrent = [LAYER_KINDS[k] for k in ("linear_attention", "short_conv")]
    assert all(k.off == recurrent[0].off and k.notes == recurrent[0].notes for k in recurrent)
    assert all(k.sglang_defaults == recurrent[0].sglang_defaults for k in recurrent)
    assert FAMILIES["lfm2"].features_off() == FAMILIES["qwen3_5"].features_off()


def test_recurrent_families_are_held_to_transformers_split_where_the_engine_splits():
    """verify compares a recurrent family's continuation with transformers computing it in
    the Engine's order (the prompt split at the query's end) when prefill-only KV splits
    it there (both prefill-only features on), and with one whole forward otherwise."""
    from prefillonly_sgl.verification.verify import Expected, Variant, splits_at_prefix

    moe, llama = family_of("Qwen3_5MoeForCausalLM"), family_of("LlamaForCausalLM")
    assert moe.splits_at_prefix() and not llama.splits_at_prefix()
    assert all(family_of(a).splits_at_prefix() for a in ("Lfm2ForCausalLM",
               "GraniteMoeHybridForCausalLM", "Qwen3NextForCausalLM"))  # fmt: skip
    ours = Variant("all features", {}, ("prefill_attention", "prefill_kv", "jct_scheduler"))
    assert splits_at_prefix(moe, ours) and not splits_at_prefix(llama, ours)
    assert not splits_at_prefix(moe, Variant("prefill_kv off", {}, ("prefill_attention",)))
    assert not splits_at_prefix(moe, Variant("stock SGLang", {}, ()))
    expected = Expected([[0.5]], [[0.5]], [None], [[-1.0]], continuation_split=[[-1.1]])
    assert expected.for_engine_that_splits().continuation == [[-1.1]]
    whole = Expected([[0.5]], [[0.5]], [None], [[-1.0]])
    assert whole.for_engine_that_splits() is whole


def test_a_family_with_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown layer kinds"):
        families.Family("x", "X", ("XForCausalLM",), ("warp_attention",))


def test_read_architectures_of_a_folder(tmp_path):
    assert families.read_architectures(tmp_path) == []  # no config.json
    _folder(tmp_path, ["Gemma3ForCausalLM"])
    assert families.family_of_model(tmp_path).name == "gemma3"


def test_resolve_switches_off_what_the_family_cannot_run(tmp_path):
    folder = _folder(tmp_path, ["Qwen3_5ForConditionalGeneration"])
    config = runtime_config.resolve(folder, device="cpu")
    assert config.model_family == "qwen3_5"
    assert "prompt_logprobs" not in config.features
    assert "prefill_kv" in config.features and "prefill_attention" in config.features
    assert set(config.features_off) == {"prompt_logprobs", LAYER_MODE}
    assert "recurrent layer" in config.features_off["prompt_logprobs"]
    # Layer mode is the family's to refuse: hybrid prefilling stays on, in token mode,
    # with token mode's default chunk.
    assert config.settings("hybrid_prefill").mode == "token"
    assert config.settings("hybrid_prefill").chunk_size == 2048
    warnings = config.start_warnings()
    assert len(warnings) == 2 and all("Qwen3.5" in w and "docs/models.md" in w for w in warnings)
    # Its kind of layer asks SGLang for the state cache a prefix snapshot needs.
    assert config.sglang_defaults()["mamba_radix_cache_strategy"] == "no_buffer"
    # The workers and /server_info get the same record.
    worker = runtime_config.WorkerConfig.from_json(config.worker.to_json())
    assert worker.model_family == "qwen3_5" and worker.features_off == config.features_off
    assert worker.info() == {
        "model_family": "qwen3_5",
        "features": list(config.features),
        "features_off": dict(config.features_off),
    }


def test_what_the_user_switched_off_is_not_reported_as_the_familys(tmp_path):
    folder = _folder(tmp_path, ["Qwen3_5ForCausalLM"])
    config = runtime_config.resolve(
        folder, device="cpu", switches={"prompt_logprob_cache": False, "hybrid_prefill": False}
    )
    assert config.features_off == {}
    # A mode the user chose is theirs too (token), and nothing is reported.
    config = runtime_config.resolve(folder, device="cpu", options={"hybrid_prefill_mode": "token"})
    assert set(config.features_off) == {"prompt_logprobs"}


def test_asking_explicitly_for_what_the_family_cannot_run_is_an_error(tmp_path):
    folder = _folder(tmp_path, ["Qwen3_5ForCausalLM"])
    with pytest.raises(ValueError, match=r"prompt_logprob_cache: Qwen3.5 .*docs/models.md"):
        runtime_config.resolve(folder, device="cpu", switches={"prompt_logprob_cache": True})
    with pytest.raises(ValueError, match=r"hybrid_prefill_mode layer: Qwen3.5 .*docs/models.md"):
        runtime_config.resolve(folder, device="cpu", options={"hybrid_prefill_mode": "layer"})
    # serve --features names them explicitly, in serve's words.
    with pytest.raises(ValueError, match=r"prompt_logprobs: Qwen3.5 models cannot run it"):
        runtime_config.resolve(
            folder, device="cpu", features=["prefill_attention", "prompt_logprobs"], style="serve"
        )
    with pytest.raises(ValueError, match="--hybrid-prefill-mode layer: Qwen3.5"):
        runtime_config.resolve(
            folder, device="cpu", options={"hybrid_prefill_mode": "layer"}, style="serve"
        )


def test_a_llama_shaped_family_keeps_every_feature(tmp_path):
    folder = _folder(tmp_path, ["MistralForCausalLM"])
    config = runtime_config.resolve(folder, device="cpu")
    assert config.features == tuple(FEATURES)
    assert config.features_off == {} and config.start_warnings() == []
    assert config.settings("hybrid_prefill").mode == "layer"


def test_an_unknown_architecture_is_refused_unless_verified_or_allowed(tmp_path, monkeypatch):
    """models/verified_architectures.py: outside the table, our features start only on a
    configuration `prefillonly verify` passed (its record, by config hash) or on an
    architecture the user allows by name; otherwise the start is refused, naming verify,
    the opt-in and docs/models.md. Stock SGLang (no features) is SGLang's own business."""
    monkeypatch.setenv("PREFILLONLY_CACHE", str(tmp_path / "cache"))
    folder = _folder(tmp_path, ["BrandNewForCausalLM"])
    with pytest.raises(verified_architectures.UnverifiedArchitectureError) as refused:
        runtime_config.resolve(folder, device="cpu")
    message = str(refused.value)
    assert "BrandNewForCausalLM" in message and f"prefillonly verify {folder}" in message
    assert "allow_architectures=['BrandNewForCausalLM']" in message and "docs/models.md" in message
    with pytest.raises(ValueError, match="--allow-architecture BrandNewForCausalLM"):
        runtime_config.resolve(folder, device="cpu", style="serve")
    assert runtime_config.resolve(folder, device="cpu", features=[]).features == ()  # stock
    # allowed by name: starts, untested, with the warning naming verify
    config = runtime_config.resolve(
        folder, device="cpu", allow_architectures=("BrandNewForCausalLM",)
    )
    assert config.model_family is None and config.features == tuple(FEATURES)
    (warning,) = config.start_warnings()
    assert "BrandNewForCausalLM" in warning and "prefillonly verify" in warning
    # verified: the record of this configuration lets it start; another config does not
    verified_architectures.write_record(folder, ["BrandNewForCausalLM"], "cpu", "float32", 1e-6)
    assert runtime_config.resolve(folder, device="cpu").features == tuple(FEATURES)
    other = _folder(tmp_path / "other", ["BrandNewForCausalLM"])
    config_json = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config_json, "hidden_size": 7}))
    with pytest.raises(verified_architectures.UnverifiedArchitectureError):
        runtime_config.resolve(other, device="cpu")


def test_a_config_hash_ignores_what_names_a_copy(tmp_path):
    folder = _folder(tmp_path, ["BrandNewForCausalLM"])
    config = json.loads((folder / "config.json").read_text())
    digest = verified_architectures.config_hash(folder)
    (folder / "config.json").write_text(
        json.dumps({**config, "_name_or_path": "/elsewhere", "transformers_version": "9.9"})
    )
    assert verified_architectures.config_hash(folder) == digest
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 99}))
    assert verified_architectures.config_hash(folder) != digest
    assert verified_architectures.config_hash(tmp_path / "missing") is None


def test_registry_imports_neither_sglang_nor_torch():
    import subprocess
    import sys

    code = (
        "import sys, prefillonly_sgl.models.families; "
        "print(any(m.split('.')[0] in ('sglang', 'torch') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_full_attention_interval_is_read_from_layer_types_and_the_other_way_round():
    linear, full = "linear_attention", "full_attention"
    assert config_fields.full_attention_interval_of([linear] * 3 + [full]) == 4
    assert config_fields.full_attention_interval_of([linear, full] * 3) == 2
    assert config_fields.full_attention_interval_of([full] * 2) == 1
    for layout in ([linear, full, linear, linear], [linear] * 4, [full, linear, full, full]):
        with pytest.raises(ValueError, match="every k-th layer.*docs/models.md"):
            config_fields.full_attention_interval_of(layout)
    legacy = {"full_attention_interval": 2, "num_hidden_layers": 4}
    assert config_fields.layer_types_of(legacy) == [linear, full, linear, full]
    assert config_fields.layer_types_of({"text_config": {"layer_types": [linear, full]}}) == [
        linear,
        full,
    ]
    assert config_fields.layer_types_of({"num_hidden_layers": 4}) is None


def test_rotary_parameters_per_layer_type_are_one_theta_and_the_full_layers_scaling():
    default = {"rope_type": "default", "rope_theta": 500000.0}
    yarn = {"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0}
    per_type = {"full_attention": default, "sliding_attention": default}
    assert config_fields.rope_by_layer_type(per_type) == (500000.0, None)
    scaled = {"full_attention": yarn, "sliding_attention": default}
    assert config_fields.rope_by_layer_type(scaled) == (500000.0, yarn)
    assert config_fields.rope_by_layer_type({"rope_type": "default", "rope_theta": 1.0}) is None
    # as transformers' base class leaves them, its flat reading added beside the per-type ones
    added = {**per_type, "rope_type": "default", "rope_theta": 10000.0}
    assert config_fields.rope_by_layer_type(added) == (500000.0, None)
    assert config_fields.rope_by_layer_type(None) is None
    other = {"full_attention": default, "sliding_attention": {**default, "rope_theta": 1e4}}
    with pytest.raises(ValueError, match="sliding-window layers.*docs/models.md"):
        config_fields.rope_by_layer_type(other)


def test_exaone4_fields_read_as_sglangs_code_reads_them():
    """config_fields for SGLang's EXAONE 4 (sglang_runtime/model_configs.py): the pattern
    string from layer_types, the theta from one set of rotary parameters."""
    sliding, full = "sliding_attention", "full_attention"
    assert config_fields.sliding_pattern_of([sliding] * 3 + [full]) == "LLLG"
    assert config_fields.sliding_pattern_of([sliding, full] * 2) == "LG"
    assert config_fields.sliding_pattern_of([full] * 4) is None  # no windows
    assert config_fields.sliding_pattern_of(None) is None
    with pytest.raises(ValueError, match="EXAONE 4.*every k-th layer.*docs/models.md"):
        config_fields.sliding_pattern_of([sliding, full, sliding, sliding])
    assert config_fields.flat_rope_theta({"rope_type": "default", "rope_theta": 1e6}) == 1e6
    assert config_fields.flat_rope_theta({"full_attention": {"rope_theta": 1.0}}) is None
    assert config_fields.flat_rope_theta(None) is None
