"""Pipeline: German credit applicants classified good / bad with a @prefillonly.classifier
run by the batch runner (prefillonly_sgl/pipelines/credit.py); prints accuracy and ROC AUC
with and without contextual calibration, next to the majority-class baseline.

    python examples/credit_scoring.py [--limit 200] [--shots 4] [--model FOLDER]
"""

from __future__ import annotations

import argparse

from prefillonly_sgl.pipelines import credit
from prefillonly_sgl.pipelines.common import add_engine_arguments

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="applicants to score")
    parser.add_argument("--shots", type=int, default=4, help="few-shot examples (half bad)")
    add_engine_arguments(parser)
    args = parser.parse_args()
    credit.print_report(
        credit.run(args.limit, args.shots, model=args.model, device=args.device, out=args.out)
    )
