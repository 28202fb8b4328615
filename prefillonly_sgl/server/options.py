"""Command-line options of `prefillonly serve` (plain Python, no SGLang at import).

`serve` accepts its own few options plus every SGLang server flag. Ours are parsed here;
the rest goes unchanged to SGLang's own parser (sglang_runtime/server_flags.py), once; the
runtime configuration is read from its values (serve_config), and its decisions and the
per-device defaults for the flags the user did not give are written back (server_flags).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefillonly_sgl.config import runtime_config
from prefillonly_sgl.config.runtime_config import RuntimeConfig
from prefillonly_sgl.features import FEATURES, JCT_POLICY, OPTIONS, parse_names
from prefillonly_sgl.machine.device_defaults import CPU_DEFAULT_MAX_TOTAL_TOKENS
from prefillonly_sgl.moderation.guards import GUARDS

DEFAULT_MAX_PENDING_REQUESTS = 256
DEFAULT_MAX_PENDING_PROMPTS = 4096
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0
RERANK_METHODS = ("auto", "judge", "query-likelihood")  # apis/rerankers.py
RERANK_ANSWERS = ("cohere", "sglang")  # apis/rerank.py
SYSTEMONE_CONVENTIONS = ("systemone", "vllm")  # wire/systemone.py


@dataclass(frozen=True)
class ServeOptions:
    """What `serve` adds on top of SGLang's server (see add_serve_options for meanings)."""

    apps: tuple[str, ...] = ()
    rerank: str | None = None  # a ranker in the --app modules for /v1/rerank
    rerank_method: str = "auto"  # the built-in reranker: auto, judge, query-likelihood
    rerank_answer: str = "cohere"  # /v1/rerank's answer without `rid`: cohere or sglang
    systemone_conventions: str = "systemone"  # /v1/systemone's answer: systemone or vllm
    guard: str | None = None  # /v1/moderations' guard family (None: the chat template's)
    classify: str | None = None  # a classifier in the --app modules for /v1/classify
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    max_pending_prompts: int = DEFAULT_MAX_PENDING_PROMPTS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    features: str | None = None  # --features: comma-separated names; None: every feature
    disabled: tuple[str, ...] = ()  # feature names, from the features' --disable-* flags
    # The features' options given (features.OPTIONS: Engine argument -> value).
    feature_options: dict[str, Any] = field(default_factory=dict)
    metrics: bool = True
    schedule_policy: str = JCT_POLICY  # "jct", or one of SGLang's (passed on to SGLang)
    memory_budget: str | None = None  # e.g. "6GiB": sizes the KV pool (memory/budget.py)
    max_prompt_tokens: int | None = None  # the longest prompt the budget must fit
    tenant_keys: str | None = None  # a file of API keys, one tenant each (server/tenant_keys.py)
    # architectures outside the family table allowed to start unverified (--allow-architecture)
    allow_architectures: tuple[str, ...] = ()

    @property
    def jct(self) -> bool:
        return self.schedule_policy == JCT_POLICY


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _flag_type(convert):
    """A feature option's converter as an argparse type (its ValueError as a usage error)."""

    def parse(text: str):
        try:
            return convert(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = getattr(convert, "__name__", "value")
    return parse


def serve_options_group(parser: argparse.ArgumentParser):
    return parser.add_argument_group(
        "prefillonly options",
        "Everything else on the command line is an SGLang server flag (listed below) and "
        "is passed to SGLang unchanged. Defaults filled in when not given: --model-path "
        "(the embedded SmolLM2-135M-Instruct), --device (cuda if available, else cpu), "
        "--attention-backend (cpu: torch_native, cuda: flashinfer), --max-total-tokens "
        f"(cpu: {CPU_DEFAULT_MAX_TOTAL_TOKENS}), --dtype (cpu: the model folder's own; "
        "SGLang's auto would run a float32 folder in float16), --sleep-on-idle (cpu), "
        "--enable-metrics, "
        "--enable-cache-report.",
    )


def add_serve_options(parser: argparse.ArgumentParser, group=None) -> None:
    """Our options, in `group` (default: a new "prefillonly options" group). Ours take
    --schedule-policy from SGLang (jct, or SGLang's policy passed on)."""
    group = group if group is not None else serve_options_group(parser)
    group.add_argument(
        "--app",
        dest="apps",
        action="append",
        default=[],
        metavar="MODULE_OR_FILE",
        help="a Python module name or .py file whose classifiers/rankers become typed JSON "
        "endpoints (see docs/server.md); repeatable",
    )
    group.add_argument(
        "--rerank",
        default=None,
        metavar="NAME",
        help="the @ranker of the --app modules behind POST /v1/rerank, /v2/rerank and /rerank "
        "(default: a built-in, see --rerank-method; docs/reranking.md)",
    )
    group.add_argument(
        "--rerank-method",
        default="auto",
        choices=RERANK_METHODS,
        help="the built-in reranker: judge (Qwen3-Reranker's yes/no prompt, for generative "
        "rerankers), query-likelihood (the query's log-probability after the document, any "
        "model); auto (default): judge for a model named as a reranker, else query-likelihood",
    )
    group.add_argument(
        "--rerank-answer",
        default="cohere",
        choices=RERANK_ANSWERS,
        help="what POST /v1/rerank answers: cohere (default): Cohere's object, which Cohere's, "
        "Jina's and vLLM's clients parse; sglang: SGLang's list of {score, document, index}, "
        "as `sglang serve` answers, for SGLang's own clients (a request carrying SGLang's "
        "`rid` gets SGLang's list either way; docs/server.md)",
    )
    group.add_argument(
        "--systemone-conventions",
        default="systemone",
        choices=SYSTEMONE_CONVENTIONS,
        help="the answer of POST /v1/systemone: systemone (default): System One's, as "
        "typesafe-sdk and SGLang give it; vllm: vLLM's (its confidence, diagnostics, "
        "usage and limits), for clients of vLLM's /v1/systemone (docs/decisions.md)",
    )
    group.add_argument(
        "--guard",
        default=None,
        choices=GUARDS,
        help="how POST /v1/moderations reads the served model: a guard family, when its "
        "chat template does not say (default: recognised from the template; a model that "
        "is no guard checks the caller's `policies`; docs/moderation.md)",
    )
    group.add_argument(
        "--classify",
        default=None,
        metavar="NAME",
        help="the @classifier of the --app modules behind POST /v1/classify (one input parameter)",
    )
    group.add_argument(
        "--max-pending-requests",
        type=_positive_int,
        default=DEFAULT_MAX_PENDING_REQUESTS,
        help="work requests admitted at once (tokenizing, queued or running); more are "
        f"answered 503 with Retry-After (default {DEFAULT_MAX_PENDING_REQUESTS})",
    )
    group.add_argument(
        "--max-pending-prompts",
        type=_positive_int,
        default=DEFAULT_MAX_PENDING_PROMPTS,
        help="prompts (score items, generate batch entries) admitted at once; more are "
        "answered 503, and a single request with more is answered 413 "
        f"(default {DEFAULT_MAX_PENDING_PROMPTS})",
    )
    group.add_argument(
        "--max-request-bytes",
        type=_positive_int,
        default=DEFAULT_MAX_REQUEST_BYTES,
        help=f"largest request body; larger ones get 413 (default {DEFAULT_MAX_REQUEST_BYTES})",
    )
    group.add_argument(
        "--shutdown-timeout",
        type=float,
        default=DEFAULT_SHUTDOWN_TIMEOUT_S,
        help="on SIGTERM, seconds in-flight requests get to finish before they are aborted "
        "(new requests get 503 meanwhile; default %(default)s)",
    )
    group.add_argument(
        "--features",
        "--patches",  # its earlier name
        dest="features",
        default=None,
        metavar="NAMES",
        help="comma-separated runtime features to apply (default: all: "
        f"{', '.join(FEATURES)}; '' for none, i.e. stock SGLang behaviour)",
    )
    # The feature registry's flags: a switch off per feature, then each feature's options.
    for feature in FEATURES.values():
        if feature.disable_flag:
            group.add_argument(
                feature.disable_flag,
                dest="disabled",
                action="append_const",
                const=feature.name,
                default=[],
                help=f"leave {feature.name} out ({feature.summary}): stock SGLang behaviour",
            )
    group.add_argument(
        "--schedule-policy",
        default=JCT_POLICY,
        metavar="POLICY",
        help="jct (default): the JCT-aware scheduler (docs/scheduler.md); any of SGLang's "
        "policies (fcfs, lpm, shortest-prefill-first, ...) for A/B runs",
    )
    for _, option in OPTIONS.values():
        group.add_argument(
            option.flag,
            dest=option.engine_arg,
            type=_flag_type(option.type),
            default=None,
            metavar=option.metavar,
            choices=option.choices,
            help=option.help,
        )
    group.add_argument(
        "--memory-budget",
        default=None,
        metavar="SIZE",
        help="memory (e.g. 6GiB) for the model, the longest prompt's activations and the KV "
        "pool together: the longest prompt is measured once per settings, the pool gets "
        "the rest (instead of --max-total-tokens; docs/hybrid_prefill.md)",
    )
    group.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        default=None,
        metavar="TOKENS",
        help="with --memory-budget: the longest prompt it must fit (default: the longest the "
        "server accepts, about the context)",
    )
    group.add_argument(
        "--tenant-keys",
        default=None,
        metavar="FILE",
        help="API keys, one tenant each (instead of --api-key): lines 'tenant key', or JSON "
        '{"tenant": "key" or ["key", ...]}; each tenant\'s requests reuse and report only '
        "their own cached prefixes (docs/server.md, Tenants)",
    )
    group.add_argument(
        "--allow-architecture",
        dest="allow_architectures",
        action="append",
        default=[],
        metavar="ARCHITECTURE",
        help="let a model architecture outside the family table start with the features on, "
        "unverified (without it only a configuration `prefillonly verify` passed starts; "
        "docs/models.md); repeatable",
    )
    group.add_argument(
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="do not turn on SGLang's Prometheus metrics (/metrics) by default",
    )


def parse_serve_argv(argv: list[str]) -> tuple[ServeOptions, list[str]]:
    """Split argv into our options and the rest, SGLang's flags (unchanged, in order)."""
    parser = argparse.ArgumentParser(prog="prefillonly serve", add_help=False, allow_abbrev=False)
    add_serve_options(parser)
    ours, rest = parser.parse_known_args(argv)
    return (
        ServeOptions(
            apps=tuple(ours.apps),
            rerank=ours.rerank,
            rerank_method=ours.rerank_method,
            rerank_answer=ours.rerank_answer,
            systemone_conventions=ours.systemone_conventions,
            guard=ours.guard,
            classify=ours.classify,
            max_pending_requests=ours.max_pending_requests,
            max_pending_prompts=ours.max_pending_prompts,
            max_request_bytes=ours.max_request_bytes,
            shutdown_timeout=ours.shutdown_timeout,
            features=ours.features,
            disabled=tuple(ours.disabled),
            feature_options={
                arg: getattr(ours, arg) for arg in OPTIONS if getattr(ours, arg) is not None
            },
            metrics=ours.metrics,
            schedule_policy=ours.schedule_policy,
            memory_budget=ours.memory_budget,
            max_prompt_tokens=ours.max_prompt_tokens,
            tenant_keys=ours.tenant_keys,
            allow_architectures=tuple(ours.allow_architectures),
        ),
        rest,
    )


@dataclass(frozen=True)
class SGLangFlags:
    """SGLang's server flags as SGLang's own parser read them
    (sglang_runtime/server_flags.parse_flags): every ServerArgs value by field name, which
    of them the user gave (a value other than SGLang's default, on the command line or in a
    --config file), and the argv they came from."""

    values: Mapping[str, Any]
    given: frozenset[str] = frozenset()
    argv: tuple[str, ...] = ()

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def with_values(self, **values: Any) -> SGLangFlags:
        return dataclasses.replace(self, values={**self.values, **values})


def serve_config(options: ServeOptions, flags: SGLangFlags) -> RuntimeConfig:
    """serve's runtime configuration: our options plus the SGLang flags it depends on
    (model, device, dtype, context, pool), resolved by the same rules as the Engine's
    (runtime_config.resolve; errors name serve's flags)."""
    return runtime_config.resolve(
        flags.get("model_path"),
        device=flags.get("device"),
        dtype=flags.get("dtype") or "auto",
        context_length=flags.get("context_length"),
        max_total_tokens=flags.get("max_total_tokens"),
        memory_budget=options.memory_budget,
        max_prompt_tokens=options.max_prompt_tokens,
        features=None if options.features is None else parse_names(options.features),
        switches={
            **{FEATURES[name].engine_arg: False for name in options.disabled},
            "schedule_policy": options.schedule_policy,
        },
        options=options.feature_options,
        style="serve",
        allow_architectures=options.allow_architectures,
    )


def server_flags(config: RuntimeConfig, flags: SGLangFlags, metrics: bool = True) -> SGLangFlags:
    """The SGLang flags serve runs with: the user's, the device defaults where the user gave
    none, and what the configuration decides (its sglang_fields), which replaces a user's
    value: `--dtype auto` on CPU becomes the folder's dtype, as in the Engine (the
    configuration's rules already refused real conflicts, e.g. a memory budget with a pool
    size)."""
    defaults = dict(config.sglang_defaults())
    if metrics:
        # Queue length, latency histograms and prefix-cache hit rate on /metrics, and
        # per-request queue time in meta_info (read by the usage report).
        defaults["enable_metrics"] = True
    defaults["enable_cache_report"] = True  # cached_tokens in OpenAI-style usage
    fields = {name: _as_flag_value(value) for name, value in config.sglang_fields().items()}
    unset = {name: value for name, value in defaults.items() if name not in flags.given}
    return flags.with_values(**unset, **fields)


def _as_flag_value(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else value
