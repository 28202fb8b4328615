"""Pipeline: label drug reviews positive / neutral / negative with a @prefillonly.classifier
run by the batch runner (prefillonly_sgl/pipelines/drug_review_labeling.py); prints accuracy and
the confusion matrix with and without contextual calibration.

    python examples/drug_review_labeling.py [--limit 150] [--shots 2] [--model FOLDER]
"""

from __future__ import annotations

import argparse

from prefillonly_sgl.pipelines import drug_review_labeling
from prefillonly_sgl.pipelines.common import add_engine_arguments

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=150, help="test reviews to label")
    parser.add_argument("--shots", type=int, default=2, help="few-shot examples per label")
    add_engine_arguments(parser)
    args = parser.parse_args()
    drug_review_labeling.print_report(
        drug_review_labeling.run(
            args.limit, args.shots, model=args.model, device=args.device, out=args.out
        )  # fmt: skip
    )
