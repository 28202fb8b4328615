"""One runtime configuration (plain Python): what `Engine(...)` and `prefillonly serve` ask
for, resolved once into a frozen RuntimeConfig that owns every default and every rule
between settings. Both entry points build their request and call `resolve`; neither
checks a setting itself.

The rules, all here:
- which features apply: the Engine's switches / serve's --features and --disable-* flags,
  with their dependencies (features.select_features);
- a feature's options (jct_aging, hybrid_prefill_chunk_size, ...) apply only with it on;
- a memory budget replaces max_total_tokens (not both); max_prompt_tokens needs a budget;
  on CUDA a budget raises SGLang's mem_fraction_static (the plan holds the reserve);
- the JCT policy replaces SGLang's inside its scheduler, which runs FCFS underneath;
- per-device SGLang defaults (machine/device_defaults.py), the user's values always winning;
- the model's family (models/families.py): a feature (or a feature's mode) its kinds of layer
  cannot run is off, with the reason (config.features_off), and an error where the user
  asked for it explicitly; an architecture outside the table starts with a warning.

The worker part (features and their resolved settings) travels to SGLang's processes as
one JSON value in one environment variable (environment.RUNTIME_CONFIG); each process's
plugin reads it once (sglang_runtime/plugin.py) and hands it to the features it installs.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillonly_sgl.features import (
    FEATURES,
    JCT_POLICY,
    OPTIONS,
    check_known,
    choose_features,
    reads_reusable_len,
)
from prefillonly_sgl.machine import environment
from prefillonly_sgl.machine.device_defaults import detect_device, resolve_dtype, sglang_defaults
from prefillonly_sgl.memory.budget import MemoryPlan, parse_size
from prefillonly_sgl.models import families, verified_architectures

# CUDA with a memory budget: SGLang caps the pool at its own profile (free memory minus a
# reserve of 1 - mem_fraction_static); a high fraction leaves the budget's pool as the cap,
# since the reserve for activations is in the plan already.
BUDGET_MEM_FRACTION_STATIC = 0.95
# SGLang's scheduler under the JCT policy: the plan decides the order, FCFS underneath.
JCT_UNDERLYING_POLICY = "fcfs"
# SGLang's preprocessed-image cache on a vision-language model with our features: what
# SGLang itself gives the models it turns it on for (Kimi-K3); a 448x448 image's pixels
# are ~4.8 MB in float32, so ~50 distinct images stay processed.
IMAGE_PREPROCESS_CACHE_MB = 256


@dataclass(frozen=True)
class FeatureContext:
    """What a feature's settings resolver may depend on."""

    model_path: str
    device: str
    dtype: str
    features: tuple[str, ...]


def _settings_class(feature_name: str):
    module_name, class_name = FEATURES[feature_name].settings.split(":")
    return getattr(importlib.import_module(module_name), class_name)


@dataclass(frozen=True)
class WorkerConfig:
    """The part of the configuration SGLang's processes need: the features to install and
    their resolved settings (feature name -> its settings object), and the file the
    memory probe appends to (set only for the memory budget's calibration engine)."""

    features: tuple[str, ...] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    memory_probe: str | None = None
    # The model's family (models/families.py; None: outside the table) and what it switched off:
    # {feature or "feature:variant": why}. Travels with the rest so that the server's
    # /server_info (read in the main process from the environment) reports it too.
    model_family: str | None = None
    features_off: Mapping[str, str] = field(default_factory=dict)

    def info(self) -> dict:
        """What get_server_info() / /server_info report under "prefillonly"."""
        return {
            "model_family": self.model_family,
            "features": list(self.features),
            "features_off": dict(self.features_off),
        }

    def to_json(self) -> str:
        data = {
            "features": list(self.features),
            "settings": {name: value.to_dict() for name, value in self.settings.items()},
            "model_family": self.model_family,
            "features_off": dict(self.features_off),
        }
        if self.memory_probe is not None:
            data["memory_probe"] = self.memory_probe
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        data = json.loads(text)
        features = tuple(check_known(data["features"], "features in the runtime config"))
        settings = {
            name: _settings_class(name).from_dict(values)
            for name, values in data.get("settings", {}).items()
        }
        return cls(
            features,
            settings,
            data.get("memory_probe"),
            data.get("model_family"),
            dict(data.get("features_off") or {}),
        )

    @classmethod
    def from_environment(cls, environ=None) -> WorkerConfig | None:
        """This process's configuration (None: not started by prefillonly: stay stock)."""
        raw = environment.read(environment.RUNTIME_CONFIG, environ)
        return None if raw is None else cls.from_json(raw)


@dataclass(frozen=True)
class MemoryRequest:
    budget: int  # bytes for the model, the longest prompt's activations and the KV pool
    max_prompt_tokens: int | None  # None: the longest prompt the engine accepts


@dataclass(frozen=True)
class RuntimeConfig:
    model_path: str
    device: str
    dtype: str  # as asked ("auto": the folder's own on CPU, device_defaults.resolve_dtype)
    context_length: int | None
    max_total_tokens: int | None  # None: the device default (or the memory plan's pool)
    schedule_policy: str  # what the user asked: "jct" or one of SGLang's policies
    worker: WorkerConfig
    memory: MemoryRequest | None = None
    memory_plan: MemoryPlan | None = None  # how the budget was split, once planned
    architectures: tuple[str, ...] = ()  # the model folder's config.json says

    @property
    def features(self) -> tuple[str, ...]:
        return self.worker.features

    @property
    def model_family(self) -> str | None:
        """The model's family (models/families.py), None outside the table."""
        return self.worker.model_family

    @property
    def features_off(self) -> Mapping[str, str]:
        """What the model's family switched off: {feature or "feature:variant": why}."""
        return self.worker.features_off

    def start_warnings(self) -> list[str]:
        """What the Engine and serve warn about once at start: each feature the family
        switched off, or an architecture outside the family table."""
        if self.model_family is None:
            return [families.unknown_architecture_warning(list(self.architectures))]
        title = families.FAMILIES[self.model_family].title
        return [
            f"{title} models run without {key}: {why} ({families.DOCS})"
            for key, why in self.features_off.items()
        ]

    def settings(self, feature: str):
        """A feature's resolved settings (None when it is off or has none)."""
        return self.worker.settings.get(feature)

    @property
    def feature_context(self) -> FeatureContext:
        return FeatureContext(self.model_path, self.device, self.dtype, self.features)

    @property
    def needs_tokenizer_hooks(self) -> bool:
        """Whether the main process attaches reusable-prefix lengths to score prompts."""
        return reads_reusable_len(self.features)

    def environment(self) -> dict[str, str]:
        """What SGLang's processes must inherit."""
        return {environment.RUNTIME_CONFIG: self.worker.to_json()}

    def sglang_environment_defaults(self) -> dict[str, str]:
        """SGLang's own variables this configuration sets unless the user set them.

        A float32 engine keeps the short-convolution states of linear-attention layers in
        float32: SGLang stores them in bfloat16 by default, which a state continued from
        the prefix cache carries into the item's tokens (4e-4 in a label's probability on
        the tiny Qwen3.5, against 2e-7 computed in one pass)."""
        if resolve_dtype(self.model_path, self.device, self.dtype) == "float32":
            return {"SGLANG_MAMBA_CONV_DTYPE": "float32"}
        return {}

    def sglang_fields(self) -> dict[str, Any]:
        """The ServerArgs fields this configuration decides (beyond the device defaults,
        which user values override): they override the user's."""
        fields: dict[str, Any] = {"model_path": self.model_path, "device": self.device}
        fields["schedule_policy"] = (
            JCT_UNDERLYING_POLICY if self.schedule_policy == JCT_POLICY else self.schedule_policy
        )
        if self.max_total_tokens is not None:
            fields["max_total_tokens"] = self.max_total_tokens
        if self.context_length is not None:
            fields["context_length"] = self.context_length
        dtype = resolve_dtype(self.model_path, self.device, self.dtype)
        if dtype != "auto":
            fields["dtype"] = dtype
        return fields

    def sglang_defaults(self) -> dict[str, Any]:
        """ServerArgs fields used unless the user gave them: the device's, plus what the
        memory budget needs."""
        defaults = sglang_defaults(self.device)
        family = families.FAMILIES.get(self.model_family) if self.model_family else None
        if family is not None:
            defaults.update(family.sglang_defaults(self.device))
        if family is not None and family.reads_images and self.features:
            # SGLang's tokenizer side processes each prompt's images anew (resizing,
            # patches) unless its content-addressed preprocess cache is on (off by default
            # for Qwen2.5-VL): a score call's N prompts carry the query's image N times, so
            # it would process that image N times per call (~0.9 ms each on a CPU) and the
            # scheduler hash its pixels N times (the cache's items carry their hash). Not
            # for stock SGLang (no features), which stays as shipped.
            defaults["mm_preprocess_cache_size_mb"] = IMAGE_PREPROCESS_CACHE_MB
        if self.memory is not None and self.device == "cuda":
            defaults["mem_fraction_static"] = BUDGET_MEM_FRACTION_STATIC
        hybrid = self.settings("hybrid_prefill")
        if self.device == "cuda" and hybrid is not None and hybrid.whole_up_to is not None:
            # SGLang's prefill CUDA graphs (breakable: its CUDA default) capture batches
            # up to their largest bucket; a bucket longer than the forwards that run whole
            # would record hybrid prefilling's chunked path (its attention plans made
            # from the batch at hand) into the graph. Longer batches run eagerly. Without
            # an explicit limit the scheduler's limit is the largest bucket or more
            # (hybrid_prefill/settings.whole_limit): stock's graphs stay as they are.
            defaults["cuda_graph_max_bs_prefill"] = hybrid.whole_up_to
        jct = self.settings("jct_scheduler")
        if (
            self.device == "cuda"
            and jct is not None
            and jct.batch_tokens is not None
            and "cuda_graph_max_bs_prefill" not in defaults
        ):
            # The JCT scheduler's batches of whole scoring prompts reach past the chunk
            # size (jct_scheduler/batch_budget.py): the prefill graphs' buckets follow, so
            # those forwards replay a graph instead of running eager (and hybrid
            # prefilling, whose limit is the largest bucket or more, leaves them whole).
            defaults["cuda_graph_max_bs_prefill"] = jct.batch_tokens
        return defaults

    def planned(self, plan: MemoryPlan) -> RuntimeConfig:
        """This configuration with the pool its memory plan leaves."""
        return dataclasses.replace(self, max_total_tokens=plan.pool_tokens, memory_plan=plan)

    def with_memory_probe(self, path: str | Path) -> RuntimeConfig:
        """The same configuration with the memory probe on, appending to `path` (the
        memory budget's calibration engine, memory/measurement.py)."""
        worker = dataclasses.replace(self.worker, memory_probe=str(path))
        return dataclasses.replace(self, worker=worker)

    def with_pool(self, pool_tokens: int) -> RuntimeConfig:
        """The same features and settings with a pool of `pool_tokens` and no budget (the
        memory calibration's engine)."""
        return dataclasses.replace(
            self, max_total_tokens=pool_tokens, memory=None, memory_plan=None
        )


def resolve(
    model_path: str | Path | None = None,
    *,
    device: str | None = None,
    dtype: str = "auto",
    context_length: int | None = None,
    max_total_tokens: int | None = None,
    memory_budget: int | str | None = None,
    max_prompt_tokens: int | None = None,
    features: list[str] | None = None,
    switches: Mapping[str, Any] | None = None,
    options: Mapping[str, Any] | None = None,
    style: str = "engine",
    allow_architectures: tuple[str, ...] | list[str] = (),
) -> RuntimeConfig:
    """The one place a configuration is made and checked.

    features: names (serve --features; None: every feature); switches: {engine_arg: value}
    of features.FEATURES (absent: default); options: {engine_arg: value} of features.OPTIONS
    (None: default). style: "engine" or "serve", the words errors use (Engine arguments or
    serve flags). allow_architectures: architectures outside the family table the user
    lets start unverified (models/verified_architectures.py: otherwise only a configuration
    `prefillonly verify` passed starts).
    """
    switches = dict(switches or {})
    options = {k: v for k, v in (options or {}).items() if v is not None}
    say = _words(style)
    if model_path is None:
        from prefillonly_sgl.models.default_model import default_model_path

        model_path = default_model_path()
    model_path = str(model_path)
    if not Path(model_path).is_dir():
        raise FileNotFoundError(f"model folder not found: {model_path}")
    device = device or detect_device()

    # Features by their Engine argument (the Engine), or by name (serve --features).
    feature_word = (lambda n: FEATURES[n].engine_arg) if style == "engine" else (lambda n: n)
    architectures = families.read_architectures(model_path)
    family = families.family_of(architectures)
    family_off = family.features_off() if family is not None else {}
    unavailable = {
        name: f"{family.title} models cannot run it: {why} ({families.DOCS})"
        for name, why in family_off.items()
        if name in FEATURES
    }
    # What the user would have had without the family: what it switched off is reported.
    wanted = choose_features(features, switches, feature_word)
    chosen = choose_features(features, switches, feature_word, unavailable)
    features_off = {
        # A feature whose dependency the family cannot run goes with it.
        name: family_off.get(name, f"needs {', '.join(FEATURES[name].needs)}")
        for name in wanted
        if name not in chosen
    }
    if family is None and chosen:
        # Our features on an architecture nobody checked: verified, allowed, or refused.
        verified_architectures.check_may_start(
            model_path, architectures, tuple(allow_architectures), style
        )
    if "hybrid_prefill" in chosen and families.LAYER_MODE in family_off:
        if options.get("hybrid_prefill_mode") == "layer":
            raise ValueError(
                f"{say('hybrid_prefill_mode')} layer: {family.title} models cannot run it: "
                f"{family_off[families.LAYER_MODE]} ({families.DOCS})"
            )
        if "hybrid_prefill_mode" not in options:
            features_off[families.LAYER_MODE] = family_off[families.LAYER_MODE]
    for arg in options:
        if arg not in OPTIONS:
            raise ValueError(f"unknown option {say(arg)}")
    for feature in FEATURES.values():
        given = [o.engine_arg for o in feature.options if o.engine_arg in options]
        if given and feature.name not in chosen:
            raise ValueError(
                f"{' / '.join(say(arg) for arg in given)} "
                f"{'applies' if len(given) == 1 else 'apply'} with {_switch_words(feature, say)}"
            )

    if memory_budget is not None:
        if max_total_tokens is not None:
            raise ValueError(f"give {say('memory_budget')} or {say('max_total_tokens')}, not both")
        memory = MemoryRequest(parse_size(memory_budget), max_prompt_tokens)
    elif max_prompt_tokens is not None:
        raise ValueError(f"{say('max_prompt_tokens')} applies with {say('memory_budget')}")
    else:
        memory = None

    context = FeatureContext(model_path, device, dtype, tuple(chosen))
    settings = {}
    for name in chosen:
        feature = FEATURES[name]
        if feature.settings:
            mine = {
                o.engine_arg: options[o.engine_arg]
                for o in feature.options
                if o.engine_arg in options
            }
            if name == "hybrid_prefill" and families.LAYER_MODE in features_off:
                mine["hybrid_prefill_mode"] = "token"  # the family's, above
            settings[name] = _settings_class(name).resolve(context, **mine)
            if name == "hybrid_prefill" and memory is not None:
                settings[name] = _budgeted_hybrid(settings[name])
    policy = switches.get("schedule_policy", JCT_POLICY)
    return RuntimeConfig(
        model_path=model_path,
        device=device,
        dtype=dtype,
        context_length=context_length,
        max_total_tokens=max_total_tokens,
        schedule_policy=policy,
        worker=WorkerConfig(
            tuple(chosen),
            settings,
            model_family=family.name if family is not None else None,
            features_off=features_off,
        ),
        memory=memory,
        architectures=tuple(architectures),
    )


def _budgeted_hybrid(hybrid):
    """Under a memory budget every forward past one chunk runs in chunks, as the budget's
    measurement assumes: its calibration engine (a small pool, hence other SGLang budgets)
    and the engine itself must chunk alike, and a whole batch up to stock's batch budget
    could peak above the chunked longest prompt that was measured. Without a budget only
    forwards past stock's batch chunk (hybrid_prefill/settings.py)."""
    if hybrid.whole_up_to is not None:
        return hybrid
    return dataclasses.replace(hybrid, whole_up_to=hybrid.chunk_size)


def from_engine_args(
    model: str | Path | None,
    *,
    device: str | None,
    dtype: str,
    max_total_tokens: int | None,
    context_length: int | None,
    memory_budget: int | str | None,
    max_prompt_tokens: int | None,
    **kwargs,
) -> tuple[RuntimeConfig, dict[str, Any]]:
    """Engine(...)'s arguments as (configuration, the other ServerArgs fields): a keyword
    that is a feature's switch or option (features/__init__.py), or allow_architectures,
    is the configuration's, the rest goes to SGLang unchanged."""
    switch_args = {f.engine_arg for f in FEATURES.values()}
    allowed = kwargs.pop("allow_architectures", None) or ()
    if isinstance(allowed, str):
        allowed = (allowed,)
    config = resolve(
        model,
        device=device,
        dtype=dtype,
        context_length=context_length,
        max_total_tokens=max_total_tokens,
        memory_budget=memory_budget,
        max_prompt_tokens=max_prompt_tokens,
        switches={k: v for k, v in kwargs.items() if k in switch_args},
        options={k: v for k, v in kwargs.items() if k in OPTIONS},
        allow_architectures=tuple(allowed),
    )
    sglang_args = {k: v for k, v in kwargs.items() if k not in switch_args and k not in OPTIONS}
    return config, sglang_args


def _words(style: str):
    """How the user called a setting: the Engine argument, or serve's flag."""
    if style == "engine":
        return lambda arg: arg
    flags = {o.engine_arg: o.flag for _, o in OPTIONS.values()}
    flags.update({f.engine_arg: f.disable_flag for f in FEATURES.values() if f.disable_flag})
    flags["schedule_policy"] = "--schedule-policy"
    return lambda arg: flags.get(arg, "--" + arg.replace("_", "-"))


def _switch_words(feature, say) -> str:
    if feature.engine_arg == "schedule_policy":
        return f"{say('schedule_policy')} {JCT_POLICY}"
    if say(feature.engine_arg) == feature.engine_arg:
        return f"{feature.engine_arg}=True"
    return f"{feature.name} on"
