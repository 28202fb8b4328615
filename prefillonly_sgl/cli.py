"""The `prefillonly` command line (also `python -m prefillonly_sgl`)."""

from __future__ import annotations

import argparse
import os
import sys

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
    from prefillonly_sgl.server.options import device_of, parse_serve_argv, with_defaults

    if "-h" in argv or "--help" in argv:
        _serve_help()
        return 0
    options, sglang_argv = parse_serve_argv(argv)
    from prefillonly_sgl.device_defaults import detect_device
    from prefillonly_sgl.server.options import given_flags

    device = device_of(sglang_argv) or detect_device()
    default_model = None
    if "--model-path" not in given_flags(sglang_argv):
        from prefillonly_sgl.models.default_model import default_model_path

        default_model = str(default_model_path())
    try:
        features = _patch_features(options.patches, options.disabled_patches, options.jct)
        sglang_argv += _memory_budget_argv(options, features, sglang_argv, device, default_model)
        sglang_argv = with_defaults(sglang_argv, device, options.metrics, default_model)
        environment = _feature_environment(options, features, sglang_argv, device)
        from prefillonly_sgl.server.endpoints import load_app_endpoints

        specs = load_app_endpoints(options.apps)  # before SGLang starts: fail fast
        from prefillonly_sgl.server.ranking_apis import ranking_api_endpoints

        specs += ranking_api_endpoints(options.apps, options.rerank, options.classify)
    except (ValueError, TypeError, ImportError, OSError) as e:
        print(f"prefillonly serve: {e}", file=sys.stderr)
        return 2
    # The runtime patches (and their settings) reach SGLang's workers through the
    # environment (see plugin.py).
    os.environ.update(environment)
    from prefillonly_sgl.features import reads_reusable_len

    if reads_reusable_len(features):
        # Tokenizer-side hooks run in this (the HTTP server's) process, where SGLang's
        # plugin loader may already have run (see reusable_prefix.install_in_this_process).
        from prefillonly_sgl.sglang_runtime import reusable_prefix

        reusable_prefix.install_in_this_process()
    from prefillonly_sgl.sglang_runtime.http_server import serve

    return serve(sglang_argv, options, specs)


def _patch_features(
    patches: str | None, disabled: tuple[str, ...] = (), jct: bool = True
) -> list[str]:
    """serve's --patches / --disable-* / --schedule-policy flags as the features to apply
    (features.py)."""
    from prefillonly_sgl.features import select_features
    from prefillonly_sgl.sglang_runtime.plugin import PATCHES_ENV, requested_features

    requested = None if patches is None else requested_features({PATCHES_ENV: patches})
    return select_features(requested, list(disabled) + ([] if jct else ["jct_scheduler"]))


def _memory_budget_argv(
    options, features: list[str], sglang_argv: list[str], device: str, default_model
) -> list[str]:
    """--memory-budget as SGLang flags: the pool from the plan (memory/calibration.py,
    measured with an Engine of these features and model flags)."""
    from prefillonly_sgl.server.options import flag_value, given_flags

    if options.memory_budget is None:
        if options.max_prompt_tokens is not None:
            raise ValueError("--max-prompt-tokens applies with --memory-budget")
        return []
    if "--max-total-tokens" in given_flags(sglang_argv):
        raise ValueError("give --memory-budget or --max-total-tokens, not both")
    from prefillonly_sgl.engine import plan_memory

    context = flag_value(sglang_argv, "--context-length")
    model = flag_value(sglang_argv, "--model-path") or flag_value(sglang_argv, "--model")
    hybrid = _hybrid_settings(options, features, device)
    settings = dict(
        device=device,
        dtype=flag_value(sglang_argv, "--dtype") or "auto",
        context_length=int(context) if context else None,
        prefill_only_attention="prefill_attention" in features,
        prefill_only_kv="prefill_kv" in features,
        schedule_policy="jct" if options.jct else options.schedule_policy,
        jct_aging=options.jct_aging,
        jct_profile=options.jct_profile,
        hybrid_prefill=hybrid is not None,
        hybrid_prefill_chunk_size=hybrid.chunk_size if hybrid else None,
        hybrid_prefill_mode=hybrid.mode if hybrid else None,
    )
    plan = plan_memory(
        options.memory_budget,
        options.max_prompt_tokens,
        model_path=model or default_model,
        features=features,
        chunk_size=hybrid.chunk_size if hybrid else None,
        hybrid_mode=hybrid.mode if hybrid else None,
        engine_settings=settings,
    )
    extra = ["--max-total-tokens", str(plan.pool_tokens)]
    if device == "cuda" and "--mem-fraction-static" not in given_flags(sglang_argv):
        extra += ["--mem-fraction-static", "0.95"]  # see Engine: the plan holds the reserve
    return extra


def _feature_environment(options, features: list[str], sglang_argv: list[str], device: str):
    """The environment variables that carry the features and their settings to SGLang."""
    from prefillonly_sgl.server.options import flag_value
    from prefillonly_sgl.sglang_runtime.plugin import PATCHES_ENV

    environment = {PATCHES_ENV: ",".join(features)}
    if "jct_scheduler" in features:
        from prefillonly_sgl.scheduler.settings import JCT_SETTINGS_ENV, resolve_settings

        model = flag_value(sglang_argv, "--model-path") or flag_value(sglang_argv, "--model")
        dtype = flag_value(sglang_argv, "--dtype") or "auto"
        settings = resolve_settings(
            model, device, dtype, features, options.jct_aging, options.jct_profile
        )
        print(f"prefillonly serve: JCT scheduler, job-time model from {settings.model.source}")
        environment[JCT_SETTINGS_ENV] = settings.to_env()
    elif options.jct_aging is not None or options.jct_profile is not None:
        raise ValueError("--jct-aging / --jct-profile apply to --schedule-policy jct")
    hybrid = _hybrid_settings(options, features, device)
    if hybrid is not None:
        from prefillonly_sgl.hybrid.settings import HYBRID_SETTINGS_ENV

        environment[HYBRID_SETTINGS_ENV] = hybrid.to_env()
    return environment


def _hybrid_settings(options, features: list[str], device: str):
    """The chunk size serve runs with (None: hybrid prefilling off)."""
    from prefillonly_sgl.hybrid.settings import HybridSettings

    if "hybrid_prefill" not in features:
        if options.hybrid_prefill_chunk_size is not None:
            raise ValueError("--hybrid-prefill-chunk-size applies with hybrid prefilling on")
        if options.hybrid_prefill_mode is not None:
            raise ValueError("--hybrid-prefill-mode applies with hybrid prefilling on")
        return None
    return HybridSettings.for_device(
        device, options.hybrid_prefill_chunk_size, options.hybrid_prefill_mode
    )


def _serve_help() -> None:
    from prefillonly_sgl.server.options import add_serve_options, serve_options_group

    parser = argparse.ArgumentParser(
        prog="prefillonly serve",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # our --schedule-policy replaces SGLang's
    )
    ours = serve_options_group(parser)  # listed first
    try:
        from sglang.srt.server_args import ServerArgs

        sglang_flags = parser.add_argument_group("SGLang server flags (passed through)")
        ServerArgs.add_cli_args(sglang_flags)
        for action in parser._actions:  # serve defaults it to the embedded model
            if "--model-path" in action.option_strings:
                action.required = False
    except ImportError:
        parser.epilog = "(SGLang is not installed: its server flags cannot be listed)"
    add_serve_options(parser, ours)
    parser.print_help()


def _demo(args: argparse.Namespace) -> int:
    from prefillonly_sgl.demos import drug_review_sentiment

    drug_review_sentiment.run(limit=args.limit, model=args.model, device=args.device)
    return 0


def _profile(args: argparse.Namespace) -> int:
    from prefillonly_sgl.scheduler import profiler

    engine_args = {}
    if args.disable_prefill_only_kv:
        engine_args["prefill_only_kv"] = False
    if args.disable_prefill_only_attention:
        engine_args["prefill_only_attention"] = False
    model, report, path = profiler.run(
        args.model, args.device, args.dtype, args.max_tokens, args.repeats, args.out, **engine_args
    )
    print(f"[profile] fit: {report.summary()}")
    print(
        f"[profile] seconds = {model.per_batch:.4g} per batch + {model.per_token:.4g} x new "
        f"+ {model.per_token_cached:.4g} x new x cached + {model.per_token_squared:.4g} x new^2"
    )
    print(f"[profile] saved {path}: the Engine and `serve` use it for this model, device, dtype")
    return 0


def _prepare_model(args: argparse.Namespace) -> int:
    from prefillonly_sgl.models.default_model import default_model_path

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

    from prefillonly_sgl.batch import cli as batch_cli

    batch_cli.add_parser(commands)

    from prefillonly_sgl.replicas import cli as replicas_cli

    replicas_cli.add_parser(commands)

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
