"""The `prefillonly` command line (also `python -m prefillonly_sgl`)."""

from __future__ import annotations

import argparse
import sys


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

    prepare = commands.add_parser(
        "prepare-model", help="convert the embedded default model once and print its folder"
    )
    prepare.set_defaults(handler=_prepare_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
