"""The `prefillonly` command line (also `python -m prefillonly_sgl`)."""

from __future__ import annotations

import argparse
import os
import sys

SERVE_DESCRIPTION = """\
Serve a model over HTTP with SGLang's server: SGLang's endpoints (/v1/score, /generate,
/health, /get_model_info, /metrics, ...) unchanged, plus request checks (4xx naming the
problem instead of a crash), bounded admission (503 when overloaded), per-request usage
(cached tokens, queue and running time), clean SIGTERM shutdown, and typed endpoints from
--app modules.

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
    try:
        features = _patch_features(options.patches, options.disabled_patches)
        from prefillonly_sgl.server.endpoints import load_app_endpoints

        specs = load_app_endpoints(options.apps)  # before SGLang starts: fail fast
    except (ValueError, TypeError, ImportError, OSError) as e:
        print(f"prefillonly serve: {e}", file=sys.stderr)
        return 2
    from prefillonly_sgl.device_defaults import detect_device
    from prefillonly_sgl.server.options import given_flags

    device = device_of(sglang_argv) or detect_device()
    default_model = None
    if "--model-path" not in given_flags(sglang_argv):
        from prefillonly_sgl.models.default_model import default_model_path

        default_model = str(default_model_path())
    sglang_argv = with_defaults(sglang_argv, device, options.metrics, default_model)
    # The runtime patches reach SGLang's workers through this variable (see plugin.py).
    from prefillonly_sgl.sglang_runtime.plugin import PATCHES_ENV

    os.environ[PATCHES_ENV] = ",".join(features)
    if "prefill_kv" in features:
        # Its tokenizer-side hooks run in this (the HTTP server's) process, where SGLang's
        # plugin loader may already have run (see prefill_kv.install_tokenizer_hooks).
        from prefillonly_sgl.sglang_runtime.prefill_kv import install_tokenizer_hooks

        install_tokenizer_hooks()
    from prefillonly_sgl.sglang_runtime.http_server import serve

    return serve(sglang_argv, options, specs)


def _patch_features(patches: str | None, disabled: tuple[str, ...] = ()) -> list[str]:
    """serve's --patches / --disable-* flags as the features to apply (features.py)."""
    from prefillonly_sgl.features import select_features
    from prefillonly_sgl.sglang_runtime.plugin import PATCHES_ENV, requested_features

    requested = None if patches is None else requested_features({PATCHES_ENV: patches})
    return select_features(requested, disabled)


def _serve_help() -> None:
    from prefillonly_sgl.server.options import add_serve_options

    parser = argparse.ArgumentParser(
        prog="prefillonly serve",
        description=SERVE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_serve_options(parser)
    try:
        from sglang.srt.server_args import ServerArgs

        sglang_flags = parser.add_argument_group("SGLang server flags (passed through)")
        ServerArgs.add_cli_args(sglang_flags)
        for action in parser._actions:  # serve defaults it to the embedded model
            if "--model-path" in action.option_strings:
                action.required = False
    except ImportError:
        parser.epilog = "(SGLang is not installed: its server flags cannot be listed)"
    parser.print_help()


def _demo(args: argparse.Namespace) -> int:
    from prefillonly_sgl.demos import drug_review_sentiment

    drug_review_sentiment.run(limit=args.limit, model=args.model, device=args.device)
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
