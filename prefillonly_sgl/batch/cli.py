"""`prefillonly batch`: run a DSL classifier, ranker or moderation function from an app
file over a records file (or the built-in `moderate`: each record's `text` checked).

prefillonly batch examples/credit_app.py:credit_risk applicants.csv scores.csv
prefillonly batch app.py:credit_risk applicants.parquet out.jsonl --server http://127.0.0.1:30000
prefillonly batch moderate texts.jsonl verdicts.jsonl --server http://127.0.0.1:30000
"""

from __future__ import annotations

import argparse
import sys

from prefillonly_sgl.batch.local_runner import run_batch
from prefillonly_sgl.batch.ray_runner import DEFAULT_BUCKET
from prefillonly_sgl.batch.scoring import BatchAborted
from prefillonly_sgl.batch.sources import check_source
from prefillonly_sgl.engine import Engine
from prefillonly_sgl.scoring.errors import PrefillOnlyError
from prefillonly_sgl.server.endpoints import load_app_module

EPILOG = """\
The function's parameters are read from the record fields of the same name (--column
PARAM=FIELD when they differ). FUNCTION `moderate` checks each record's `text` with the
served guard model (--policy, repeated: the policies to check instead, on any model).
Rerunning the same command resumes an interrupted job:
finished rows are never scored again (--overwrite starts afresh). Bad records go to
OUTPUT.errors.jsonl with their row and reason; the job goes on.
"""


def add_parser(commands) -> None:
    batch = commands.add_parser(
        "batch",
        help="score a records file with a DSL classifier/ranker/moderation (resumable)",
        description="Score every record of a CSV / JSONL / Parquet file with a "
        "@prefillonly.classifier, @prefillonly.ranker or @prefillonly.moderator (or "
        "the built-in `moderate`); results (JSONL / CSV / Parquet) written as they finish.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    batch.add_argument("function", help="FILE.py:NAME or module:NAME (NAME optional if the "
                       "file declares one function), or `moderate`")  # fmt: skip
    batch.add_argument("records", help="input: .csv, .jsonl or .parquet")
    batch.add_argument("output", help="results: .jsonl, .csv or .parquet")
    where = batch.add_mutually_exclusive_group()
    where.add_argument("--server", help="a running server's URL (default: a local engine); "
                       "a keyed server's key is read from PREFILLONLY_API_KEY")  # fmt: skip
    where.add_argument("--model", help="local engine's model folder (default: SmolLM2-135M)")
    batch.add_argument("--device", choices=["cpu", "cuda"], help="local engine's device")
    batch.add_argument("--dtype", default="auto", help="local engine's dtype (default auto)")
    batch.add_argument("--column", action="append", default=[], metavar="PARAM=FIELD",
                       help="read parameter PARAM from field FIELD")  # fmt: skip
    batch.add_argument("--keep", action="append", default=[], metavar="FIELD",
                       help="copy FIELD into each result (e.g. an id)")  # fmt: skip
    batch.add_argument("--policy", action="append", default=[], metavar="TEXT",
                       help="`moderate`: a policy to check (repeat; default: the served "
                       "guard's own categories)")  # fmt: skip
    batch.add_argument("--errors", help="errors file (default OUTPUT.errors.jsonl)")
    batch.add_argument("--overwrite", action="store_true", help="discard earlier results")
    batch.add_argument("--chunk-size", type=int, default=64, help="records per call (64)")
    batch.add_argument("--no-progress", action="store_true")
    batch.add_argument("--cache-salt", metavar="SALT",
                       help="the job's prefix-cache namespace: it reuses only prefixes cached "
                       "under the same salt (docs/server.md, Tenants)")  # fmt: skip
    ray = batch.add_argument_group("on a Ray cluster (pip install 'prefillonly-sgl[ray]')")
    ray.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                     help="score on Ray Data with a pool of engine actors (ADDRESS: the "
                     "cluster's; default: the running one, else a local one); OUTPUT is "
                     "then a folder of files (.parquet, .jsonl or .csv by its name; "
                     "Parquet without)")  # fmt: skip
    ray.add_argument("--replicas", type=int, default=2, help="engine actors (2)")
    ray.add_argument("--cpus-per-replica", type=float, default=1, help="(1)")
    ray.add_argument("--gpus-per-replica", type=float, default=0, help="(0; 1 on GPUs)")
    ray.add_argument("--bucket-size", type=int, default=DEFAULT_BUCKET,
                     help=f"records per bucket: an actor's unit of work, written to OUTPUT "
                     f"as it finishes, so a rerun resumes from it ({DEFAULT_BUCKET})")  # fmt: skip
    batch.set_defaults(handler=main)


KINDS = ("classifier", "ranker", "moderation")


def find_function(target: str, policies=()):
    if target == "moderate":
        from prefillonly_sgl.dsl.moderation import text_moderation

        return text_moderation(policies=list(policies) or None)
    if policies:
        raise ValueError("--policy is the built-in `moderate`'s; declare a function's own")
    path, _, name = target.rpartition(":") if ":" in target else (target, "", "")
    module = load_app_module(path)
    found = {
        n: obj
        for n, obj in vars(module).items()
        if getattr(obj, "kind", None) in KINDS and hasattr(obj, "fn")
    }
    if name:
        if name not in found:
            raise ValueError(
                f"{path} has no classifier, ranker or moderation {name!r} (it has {sorted(found)})"
            )
        return found[name]
    if len(found) != 1:
        raise ValueError(
            f"{path} declares {len(found)} DSL functions {sorted(found)}: name one, {path}:NAME"
        )
    return next(iter(found.values()))


def parse_columns(pairs: list[str]) -> dict[str, str]:
    columns = {}
    for pair in pairs:
        param, sep, field = pair.partition("=")
        if not sep or not param or not field:
            raise ValueError(f"--column {pair!r}: expected PARAM=FIELD")
        columns[param] = field
    return columns


def main(args: argparse.Namespace) -> int:
    try:
        function = find_function(args.function, args.policy)
        columns = parse_columns(args.column)
        check_source(args.records)  # before an engine starts: fail fast
    except (ValueError, ImportError, OSError) as e:
        print(f"prefillonly batch: {e}", file=sys.stderr)
        return 2
    options = dict(
        output_format=None,
        errors_file=args.errors,
        columns=columns,
        keep=args.keep,
        overwrite=args.overwrite,
        chunk_size=args.chunk_size,
        progress=not args.no_progress,
        cache_salt=args.cache_salt,
    )
    if args.ray and args.server:
        print("prefillonly batch: --ray starts engines on the cluster; drop --server",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        if args.ray:
            engine = {"model": args.model, "device": args.device, "dtype": args.dtype}
            ray = {"replicas": args.replicas, "num_cpus": args.cpus_per_replica,
                   "num_gpus": args.gpus_per_replica, "bucket_size": args.bucket_size,
                   "address": None if args.ray == "auto" else args.ray}  # fmt: skip
            report = run_batch(function, args.records, args.output, executor="ray", ray=ray,
                               engine={k: v for k, v in engine.items() if v is not None},
                               **options)  # fmt: skip
        elif args.server:
            report = run_batch(function, args.records, args.output, engine=args.server, **options)
        else:
            with Engine(args.model, device=args.device, dtype=args.dtype) as engine:
                report = run_batch(function, args.records, args.output, engine=engine, **options)
    except KeyboardInterrupt:
        print("prefillonly batch: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except BatchAborted as e:
        print(f"prefillonly batch: {e}", file=sys.stderr)
        return 1
    except PrefillOnlyError as e:
        print(f"prefillonly batch: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        if args.ray and getattr(e, "name", None) == "ray":
            print("prefillonly batch: --ray needs Ray: pip install 'prefillonly-sgl[ray]'",
                  file=sys.stderr)  # fmt: skip
            return 2
        raise
    print(f"[batch] {report.summary()}")
    for reason in report.error_reasons:
        print(f"[batch]   {reason}")
    return 0
