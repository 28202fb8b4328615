"""Command-line options of `prefillonly serve` (plain Python, no SGLang at import).

`serve` accepts its own few options plus every SGLang server flag. Ours are parsed here;
the rest goes unchanged to SGLang's own parser (sglang.srt.server_args.prepare_server_args),
with per-device defaults added only for the flags the user did not give.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from prefillonly_sgl.device_defaults import CPU_DEFAULT_MAX_TOTAL_TOKENS, resolve_dtype
from prefillonly_sgl.hybrid.settings import MODES
from prefillonly_sgl.scheduler.settings import JCT_POLICY

DEFAULT_MAX_PENDING_REQUESTS = 256
DEFAULT_MAX_PENDING_PROMPTS = 4096
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServeOptions:
    """What `serve` adds on top of SGLang's server (see add_serve_options for meanings)."""

    apps: tuple[str, ...] = ()
    rerank: str | None = None  # a ranker in the --app modules for /v1/rerank
    classify: str | None = None  # a classifier in the --app modules for /v1/classify
    max_pending_requests: int = DEFAULT_MAX_PENDING_REQUESTS
    max_pending_prompts: int = DEFAULT_MAX_PENDING_PROMPTS
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    patches: str | None = None  # None: every runtime patch this version has
    disabled_patches: tuple[str, ...] = ()  # from the --disable-prefill-only-* flags
    metrics: bool = True
    schedule_policy: str = JCT_POLICY  # "jct", or one of SGLang's (passed on to SGLang)
    jct_aging: float | None = None
    jct_profile: str | None = None
    hybrid_prefill_chunk_size: int | None = None
    hybrid_prefill_mode: str | None = None
    memory_budget: str | None = None  # e.g. "6GiB": sizes the KV pool (memory/budget.py)
    max_prompt_tokens: int | None = None  # the longest prompt the budget must fit

    @property
    def jct(self) -> bool:
        return self.schedule_policy == JCT_POLICY


# A switch per runtime patch, for A/B runs against stock SGLang: flag -> plugin feature.
DISABLE_FLAGS = {
    "--disable-prefill-only-attention": "prefill_attention",
    "--disable-prefill-only-kv": "prefill_kv",
    "--disable-hybrid-prefill": "hybrid_prefill",
}


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


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
        help="the @ranker of the --app modules behind POST /v1/rerank (default: the built-in "
        "Qwen3-Reranker prompt, yes/no; docs/server.md)",
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
        "--patches",
        default=None,
        metavar="NAMES",
        help="comma-separated prefill-only runtime patches to apply (default: all; '' for "
        "none, i.e. stock SGLang behaviour)",
    )
    for flag, feature in DISABLE_FLAGS.items():
        group.add_argument(
            flag,
            dest="disabled_patches",
            action="append_const",
            const=feature,
            default=[],
            help=f"leave the {feature} runtime patch out (stock SGLang behaviour for it)",
        )
    group.add_argument(
        "--schedule-policy",
        default=JCT_POLICY,
        metavar="POLICY",
        help="jct (default): the JCT-aware scheduler (docs/scheduler.md); any of SGLang's "
        "policies (fcfs, lpm, shortest-prefill-first, ...) for A/B runs",
    )
    group.add_argument(
        "--jct-aging",
        type=float,
        default=None,
        metavar="LAMBDA",
        help="JCT scheduler: seconds of priority a request gains per second waited (default 1.0)",
    )
    group.add_argument(
        "--jct-profile",
        default=None,
        metavar="FILE",
        help="JCT scheduler: a profile from `prefillonly profile` (default: the saved one "
        "for this model, device, dtype and features, else the built-in default)",
    )
    group.add_argument(
        "--hybrid-prefill-chunk-size",
        type=_positive_int,
        default=None,
        metavar="TOKENS",
        help="hybrid prefilling: tokens per chunk of a long prompt (default cpu 2048, "
        "cuda 4096; docs/hybrid_prefill.md)",
    )
    group.add_argument(
        "--hybrid-prefill-mode",
        choices=MODES,
        default=None,
        help="hybrid prefilling: 'layer' (default) runs whole decoder layers in query "
        "chunks, only the residual stream and one layer's K/V whole; 'token' chunks only "
        "the MLPs, norms and rotary embeddings",
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
        "--no-metrics",
        dest="metrics",
        action="store_false",
        help="do not turn on SGLang's Prometheus metrics (/metrics) by default",
    )


def parse_serve_argv(argv: list[str]) -> tuple[ServeOptions, list[str]]:
    """Split argv into our options and the SGLang flags (returned unchanged, in order)."""
    parser = argparse.ArgumentParser(prog="prefillonly serve", add_help=False, allow_abbrev=False)
    add_serve_options(parser)
    ours, rest = parser.parse_known_args(argv)
    return (
        ServeOptions(
            apps=tuple(ours.apps),
            rerank=ours.rerank,
            classify=ours.classify,
            max_pending_requests=ours.max_pending_requests,
            max_pending_prompts=ours.max_pending_prompts,
            max_request_bytes=ours.max_request_bytes,
            shutdown_timeout=ours.shutdown_timeout,
            patches=ours.patches,
            disabled_patches=tuple(ours.disabled_patches),
            metrics=ours.metrics,
            schedule_policy=ours.schedule_policy,
            jct_aging=ours.jct_aging,
            jct_profile=ours.jct_profile,
            hybrid_prefill_chunk_size=ours.hybrid_prefill_chunk_size,
            hybrid_prefill_mode=ours.hybrid_prefill_mode,
            memory_budget=ours.memory_budget,
            max_prompt_tokens=ours.max_prompt_tokens,
        ),
        rest
        if ours.schedule_policy == JCT_POLICY
        else [*rest, "--schedule-policy", ours.schedule_policy],
    )


def given_flags(argv: list[str]) -> set[str]:
    """The long flags present in argv (`--x v` and `--x=v` forms), plus keys of a --config
    file, so defaults never override what the user chose anywhere."""
    flags = {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            flags |= _config_file_flags(argv[i + 1])
        elif arg.startswith("--config="):
            flags |= _config_file_flags(arg.split("=", 1)[1])
    if "--model" in flags:  # SGLang's alias of --model-path
        flags.add("--model-path")
    return flags


def _config_file_flags(path: str) -> set[str]:
    try:
        import yaml

        data = yaml.safe_load(Path(path).read_text()) or {}
    except Exception:  # SGLang's own parser reports a bad config file
        return set()
    return {"--" + str(key).replace("_", "-") for key in data} if isinstance(data, dict) else set()


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `--flag v` / `--flag=v` in argv (the last one wins, as in argparse)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def device_of(argv: list[str]) -> str | None:
    return flag_value(argv, "--device")


def server_defaults(device: str, metrics: bool = True) -> list[tuple[str, str | None]]:
    """(flag, value) pairs `serve` adds when absent; value None is a switch."""
    defaults: list[tuple[str, str | None]] = [("--device", device)]
    if device == "cpu":
        defaults += [
            ("--attention-backend", "torch_native"),
            ("--max-total-tokens", str(CPU_DEFAULT_MAX_TOTAL_TOKENS)),
            # SGLang's scheduler busy-polls while idle: an idle server took a whole core
            # (two replicas on a 2-core machine starved each other), ~0 with this.
            # Requests still wake it at once (zmq poll); the Engine sets the same.
            ("--sleep-on-idle", None),
        ]
    elif device == "cuda":
        defaults += [("--attention-backend", "flashinfer")]
    if metrics:
        # Queue length, latency histograms and prefix-cache hit rate on /metrics, and
        # per-request queue time in meta_info (read by the usage report).
        defaults += [("--enable-metrics", None)]
    defaults += [("--enable-cache-report", None)]  # cached_tokens in OpenAI-style usage
    return defaults


def with_defaults(
    sglang_argv: list[str], device: str, metrics: bool, default_model: str | None
) -> list[str]:
    """sglang_argv plus the defaults for every flag not given (user values always win)."""
    given = given_flags(sglang_argv)
    added: list[str] = []
    if "--model-path" not in given and default_model is not None:
        added += ["--model-path", default_model]
    for flag, value in server_defaults(device, metrics):
        if flag not in given:
            added += [flag] if value is None else [flag, value]
    model = (
        flag_value(sglang_argv, "--model-path")
        or flag_value(sglang_argv, "--model")  # SGLang's alias
        or default_model
    )
    if "--dtype" not in given and model is not None:
        dtype = resolve_dtype(model, device, "auto")  # cpu: the folder's own
        if dtype != "auto":
            added += ["--dtype", dtype]
    return list(sglang_argv) + added
