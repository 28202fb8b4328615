"""The card script's arguments (benchmarks/gpu_engine.py's command line)."""

from __future__ import annotations

import argparse
from pathlib import Path

from card_engine.systems import (
    CHECKS_LIMIT,
    DEADLINE,
    DEFAULT_PARTS,
    FULL,
    FUSED_OPS,
    MODELS,
    PARTS,
    QUICK_AB,
    QUICK_DEADLINE,
    QUICK_MODELS,
    QUICK_PARTS,
    SHAPES,
    SYSTEMS,
    TINY,
    TINY_CHECKS_LIMIT,
    TINY_DEADLINE,
    TINY_QUICK_MODELS,
)

BENCHMARKS = Path(__file__).resolve().parents[1]


def parse_args(argv, description: str = __doc__):
    parser = argparse.ArgumentParser(description=description.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=BENCHMARKS / "results" / "gpu_engine")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (the CPU test)")
    parser.add_argument("--model", choices=sorted(SHAPES), default=None)
    parser.add_argument(
        "--models", default=None, help=f"several, comma-separated ({','.join(MODELS)})"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{', '.join(QUICK_MODELS)}, parts {','.join(QUICK_PARTS)}: the first device call "
        f"(done {QUICK_DEADLINE:.0f} s after its start)",
    )
    parser.add_argument(
        "--graphs-check",
        dest="graphs_check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a second engine of stock and of ours with prefill graphs off answers the "
        "correctness cases beside each (sglang #37606); if either system's answers differ, "
        "both run their load parts without graphs (default: on CUDA, but not with --quick)",
    )
    parser.add_argument(
        "--parts",
        default=None,
        help=f"of {','.join(PARTS)} (default {','.join(DEFAULT_PARTS)}; --quick: "
        f"{','.join(QUICK_PARTS)})",
    )
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"of {','.join(SYSTEMS)} (their turns in this order)",
    )
    parser.add_argument(
        "--fused-ops",
        choices=sorted(FUSED_OPS),
        default="torch",
        help="SGLang's fused elementwise ops in every system: on their torch paths (the "
        "kit's default) or each under torch.compile (SGLANG_FORCE_FUSED_OP_BACKEND="
        "torch_compile)",
    )
    parser.add_argument(
        "--fused-ops-ab",
        default=None,
        help="systems that also run an engine with the other --fused-ops (correctness, the "
        f"items bursts, the profile), comma-separated; 'none' for none (--quick: "
        f"{','.join(QUICK_AB)})",
    )
    parser.add_argument(
        "--grid-factors",
        help="the items grid's rates, of the best system's burst capacity, comma-separated "
        "(0.6,0.7,0.8,0.9,1.0,1.2,1.5)",
    )
    parser.add_argument("--passes", type=int, help="passes of the items grid (2)")
    parser.add_argument(
        "--grid-requests",
        help="requests per rate of the items grid, LEAST-MOST (100-300; sized to fit the call)",
    )
    parser.add_argument("--bursts", type=int, help="items bursts per system (2)")
    parser.add_argument(
        "--checks-limit",
        type=float,
        default=None,
        help=f"seconds for each card check, started with the engines; the timed parts wait "
        f"for them ({CHECKS_LIMIT:.0f}, --tiny {TINY_CHECKS_LIMIT:.0f})",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help=f"seconds from the start by which the run is done (no turn or rate starts that "
        f"could not end before its model's share of it); {DEADLINE:.0f}, --tiny "
        f"{TINY_DEADLINE:.0f}",
    )
    parser.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        help="start each system's engine after the last one's parts (default: a model's "
        "engines start, and warm up, together; their timed parts still run one at a time)",
    )
    parser.add_argument("--hold-seconds", type=float, help="a rate's arrivals, s (15)")
    parser.add_argument("--hold-requests", type=int, help="... or this many requests (300)")
    parser.add_argument("--rate-factors", help="of the burst capacity, comma-separated (0.8,1.5)")
    parser.add_argument("--burst", type=int, help="requests of the burst probe (48)")
    parser.add_argument("--pool-tokens", type=int, help="each engine's KV pool on a card (131072)")
    parser.add_argument("--rec-p99", type=float, default=1.0, help="recommendation's bound, s")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu_engine_work"))
    # A child process's own arguments (the parent runs one per system).
    parser.add_argument("--system", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--label", help=argparse.SUPPRESS)
    parser.add_argument("--turns", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--graphs", choices=("auto", "off"), default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--ends-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.models:
        models = [m for m in args.models.split(",") if m]
    elif args.model:
        models = [args.model]
    elif args.quick:
        models = list(TINY_QUICK_MODELS if args.tiny else QUICK_MODELS)
    else:
        models = [TINY["model"] if args.tiny else FULL["model"]]
    unknown = sorted(set(models) - set(SHAPES))
    if unknown:
        parser.error(f"unknown models {unknown}: choose from {', '.join(sorted(SHAPES))}")
    args.models = models
    args.model = models[0]
    default_parts = QUICK_PARTS if args.quick else DEFAULT_PARTS
    parts = [p for p in (args.parts or ",".join(default_parts)).split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown parts {unknown}: choose from {', '.join(PARTS)}")
    args.parts = parts
    args.systems = [x for x in args.systems.split(",") if x]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        parser.error(f"--systems: choose from {', '.join(SYSTEMS)}")
    sizes = dict(TINY if args.tiny else FULL)
    if args.quick:
        sizes.update(sizes["quick_rec"])
    for key, value in (
        ("hold_seconds", args.hold_seconds),
        ("hold_requests", args.hold_requests),
        ("burst", args.burst),
        ("pool_tokens", args.pool_tokens),
    ):
        if value is not None:
            sizes[key] = value
    if args.rate_factors:
        sizes["rate_factors"] = tuple(float(f) for f in args.rate_factors.split(","))
    grid = dict(sizes["grid"])
    if args.grid_factors:
        grid["factors"] = tuple(sorted(float(f) for f in args.grid_factors.split(",")))
    if args.passes is not None:
        grid["passes"] = max(1, args.passes)
    if args.bursts is not None:
        grid["bursts"] = max(1, args.bursts)
    if args.grid_requests:
        least, _, most = args.grid_requests.partition("-")
        grid["least"], grid["most"] = int(least), int(most or least)
    sizes["grid"] = grid
    args.sizes = sizes
    ab = args.fused_ops_ab
    if ab is None:
        ab = ",".join(QUICK_AB) if args.quick else ""
    args.fused_ops_ab = [x for x in ab.split(",") if x and x != "none"]
    if set(args.fused_ops_ab) - set(SYSTEMS):
        parser.error(f"--fused-ops-ab: choose from {', '.join(SYSTEMS)}")
    if args.checks_limit is None:
        args.checks_limit = TINY_CHECKS_LIMIT if args.tiny else CHECKS_LIMIT
    if args.deadline is None:
        args.deadline = TINY_DEADLINE if args.tiny else QUICK_DEADLINE if args.quick else DEADLINE
    if args.graphs_check is None:
        args.graphs_check = args.device == "cuda" and not args.quick
    args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    return args
