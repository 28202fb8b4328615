"""The `prefillonly` command line (also `python -m prefillonly_sgl`)."""

from __future__ import annotations

import argparse
import sys

from prefillonly_sgl.apis import builtin_endpoints
from prefillonly_sgl.batch import cli as batch_cli
from prefillonly_sgl.demos import drug_review_sentiment
from prefillonly_sgl.engine import Engine, plan_memory
from prefillonly_sgl.features.jct_scheduler import profiler
from prefillonly_sgl.models.default_model import default_model_path
from prefillonly_sgl.replicas import cli as replicas_cli
from prefillonly_sgl.server.endpoints import load_app_endpoints
from prefillonly_sgl.server.options import (
    add_serve_options,
    parse_serve_argv,
    serve_config,
    serve_options_group,
    server_flags,
)
from prefillonly_sgl.sglang_runtime import worker_forkserver
from prefillonly_sgl.sglang_runtime.http_server import serve
from prefillonly_sgl.sglang_runtime.plugin import runtime_enabled
from prefillonly_sgl.sglang_runtime.server_flags import parse_flags, sglang_parser
from prefillonly_sgl.verification import verify as verify_command

SERVE_DESCRIPTION = """\
Serve a model over HTTP with SGLang's server: SGLang's endpoints (/v1/score, /generate,
/health, /get_model_info, /metrics, ...) in their own formats, plus request checks (4xx
naming the problem instead of a crash), bounded admission (503 when overloaded),
per-request usage (cached tokens, queue and running time), clean SIGTERM shutdown,
/v1/score_labels (label words, any number of tokens), /v1/rerank and /v1/classify served by
DSL functions, and typed endpoints from --app modules.

examples:
  prefillonly serve --port 30000                      # the embedded default model
  prefillonly serve --model-path /models/Qwen2.5-0.5B-Instruct --host 0.0.0.0
  curl -s localhost:30000/v1/score -H 'content-type: application/json' \\
    -d '{"query": "Review: great!\\nSentiment:", "items": [""], "label_token_ids": [1, 2]}'
"""


def _serve(argv: list[str]) -> int:
    if "-h" in argv or "--help" in argv:
        _serve_help()
        return 0
    options, sglang_argv = parse_serve_argv(argv)
    try:
        # First: a forkserver imports SGLang's worker modules while this process imports
        # the server's.
        worker_start = worker_forkserver.start_mode()
        flags = parse_flags(sglang_argv)  # once, by SGLang's own parser
        config = serve_config(options, flags)  # every rule: config/runtime_config.py
        # The app modules before the memory calibration and SGLang start: fail fast.
        specs = load_app_endpoints(options.apps)
        specs += builtin_endpoints(
            options.apps,
            options.rerank,
            options.classify,
            options.rerank_method,
            str(config.model_path),
            options.rerank_answer,
            options.systemone_conventions,
            options.guard,
        )
        for warning in config.start_warnings():  # the model family's (models/families.py)
            print(f"prefillonly serve: warning: {warning}", file=sys.stderr)
        if config.memory is not None:
            config = config.planned(plan_memory(config))
        flags = server_flags(config, flags, options.metrics)
        if config.settings("jct_scheduler") is not None:
            source = config.settings("jct_scheduler").model.source
            print(f"prefillonly serve: JCT scheduler, job-time model from {source}")
    except (ValueError, TypeError, ImportError, OSError) as e:
        print(f"prefillonly serve: {e}", file=sys.stderr)
        return 2
    with runtime_enabled(config):  # SGLang's workers inherit the configuration
        return serve(flags, options, specs, config.needs_tokenizer_hooks, worker_start)


def _serve_help() -> None:
    parser = argparse.ArgumentParser(
        prog="prefillonly serve",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # our --schedule-policy replaces SGLang's
    )
    ours = serve_options_group(parser)  # listed first
    try:
        sglang_parser(parser=parser.add_argument_group("SGLang server flags (passed through)"))
    except ImportError:
        parser.epilog = "(SGLang is not installed: its server flags cannot be listed)"
    add_serve_options(parser, ours)
    parser.print_help()


def _demo(args: argparse.Namespace) -> int:
    drug_review_sentiment.run(limit=args.limit, model=args.model, device=args.device)
    return 0


def _profile(args: argparse.Namespace) -> int:
    engine_args = {}
    if args.disable_prefill_only_kv:
        engine_args["prefill_only_kv"] = False
    if args.disable_prefill_only_attention:
        engine_args["prefill_only_attention"] = False
    engine_args["schedule_policy"] = profiler.MEASURING_POLICY
    with Engine(args.model, device=args.device, dtype=args.dtype, **engine_args) as engine:
        model, report, path = profiler.run(
            engine, args.dtype, args.max_tokens, args.repeats, args.out
        )
    print(f"[profile] fit: {report.summary()}")
    print(
        f"[profile] seconds = {model.per_batch:.4g} per batch + {model.per_token:.4g} x new "
        f"+ {model.per_token_cached:.4g} x new x cached + {model.per_token_squared:.4g} x new^2"
    )
    print(f"[profile] saved {path}: the Engine and `serve` use it for this model, device, dtype")
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    print(default_model_path())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prefillonly",
        description="Serve and run LLMs as classifiers, scorers and rankers (on SGLang).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="score real drug reviews (positive/negative) with the default model",
        description="Few-shot sentiment of real drug reviews: prints each prediction, "
        "the accuracy and items/s.",
    )
    demo.add_argument("--limit", type=int, default=60, help="reviews to score (default 60)")
    demo.add_argument("--model", help="a Hugging Face model folder (default: SmolLM2-135M)")
    demo.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    demo.set_defaults(handler=_demo)

    commands.add_parser(
        "serve",
        help="serve a model over HTTP (SGLang's server, hardened); "
        "`prefillonly serve --help` lists every option",
        add_help=False,
    )

    profile = commands.add_parser(
        "profile",
        help="measure the JCT scheduler's job-time model on this machine and save it",
        description="Times prefill batches over a grid of (cached, new tokens, batch size) "
        "on a running engine, fits the job-time model (R^2 and errors printed), and saves it "
        "where Engine and serve find it for this model, device, dtype and features.",
    )
    profile.add_argument("--model", help="a Hugging Face model folder (default: SmolLM2-135M)")
    profile.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda if available")
    profile.add_argument("--dtype", default="auto", help="as the engine will run (default auto)")
    profile.add_argument(
        "--max-tokens", type=int, help="longest prompt measured (default cpu 2048, cuda 16384)"
    )
    profile.add_argument("--repeats", type=int, default=3, help="timed runs per batch (median)")
    profile.add_argument("--out", help="write the profile here instead (then pass it with "
                         "--jct-profile / Engine(jct_profile=...))")  # fmt: skip
    profile.add_argument("--disable-prefill-only-attention", action="store_true")
    profile.add_argument("--disable-prefill-only-kv", action="store_true")
    profile.set_defaults(handler=_profile)

    batch_cli.add_parser(commands)

    replicas_cli.add_parser(commands)

    verify_command.add_parser(commands)

    prepare = commands.add_parser(
        "prepare-model", help="convert the embedded default model once and print its folder"
    )
    prepare.set_defaults(handler=_prepare_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":  # its flags are SGLang's: not parsed here
        return _serve(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
