"""The engine itself on a card (issues 57 and 62): prefillonly's Engine against stock
SGLang at its best per shape, side by side on the same card, model and attention backend
(FlashInfer).

    # on a lent card, through the engine kit (benchmarks/README.md, "The engine on a card"):
    bash scripts/gpu_kit/run_on_card.sh --engine --quick      # the first call: <= 420 s
    bash scripts/gpu_kit/run_on_card.sh --engine --model llama-3.2-1b   # one model, all parts
    # here, what the tests run (tiny shapes, CPU, float32):
    .venv/bin/python benchmarks/gpu_engine.py --tiny --device cpu --out /tmp/gpu_engine

A random-weight model of a published shape (Qwen3-0.6B: SGLang #9748's model; Llama-3.2-1B)
is written once with transformers (bf16 on a card). Three systems, each an Engine in a
process of its own (SGLang ends the process whose engine's worker failed; the run goes on):

- "stock": every prefillonly feature off, SGLang's lpm policy (its best for shared prefixes);
- "stock-mis": stock with SGLang's multi-item scoring (`enable_mis=True`, i.e.
  `--enable-mis`, with `--attention-backend flashinfer`, which it asserts): a request's query
  and items become one sequence, `query <d> item1 <d> item2 ... <d>` (d: SGLang's fixed
  placeholder token, constants.MIS_DELIMITER_TOKEN_ID), one forward under FlashInfer's
  item-aware mask, each item's positions restarting after the query; SGLang turns the radix
  cache, chunked prefill and CUDA graphs off for it. Measured on the items shape (its
  case) and for correctness; it needs FlashInfer, so off CUDA it is skipped, the reason
  written into the results;
- "ours": the defaults (on CUDA, hybrid prefilling's layers through FlashInfer's query
  chunks).

Parts, each written to results.json / results.md as it ends:

- correctness: label log-probabilities (over the whole vocabulary) of cold prompts, a
  shared prefix and its cache hit, a cold query with its items in one call (ours packs the
  items behind the query: one forward, counted from the forward log), and a prompt longer
  than stock's largest batch (ours: one forward, its layers in query chunks; stock: chunked
  prefill; run after the load parts, since it is a first-time kernel path), against a
  float32 transformers forward of the same weights on the same device; stock-mis against
  the sequence it scores (query, delimiter, item at its MIS positions), and, beside it, how
  far that is from query + item's;
- items: SGLang #9748's shape, requests of a 120-token query and 10 items of 180 tokens,
  Poisson arrivals at rates set from the first system's burst capacity (stock's);
  items/s at P99 <= 500 ms; every system's burst also gives its saturation throughput,
  in input tokens/s as Prelude (OpenReview 2026) reports prefill-only serving;
- recommendation: the paper's shape scaled to the card: users with 1-2k-token profiles,
  each request one user's profile and 8 items of 150 tokens, every user's requests spread
  over the run; requests/s at P99 <= --rec-p99 seconds;
- long: a cold 32k-token prompt (1.2k with the tiny sizes): time and the scheduler's peak
  memory above what it held before the forward (prefillonly's memory probe, in engines of
  their own so the probe's synchronisation slows no load run), stock (unchunked) against
  ours (hybrid prefilling).

Warm-up: after its engine starts (and after correctness, which is not timed), each system
runs representative requests of every load part's shape (a burst, a second burst, a single
request; the recommendation's with warm-up users of their own, a miss then a hit each) so
that no JIT compile (FlashInfer, Triton, SGLang's kernels, torch.compile) lands in a burst
probe or a timed rate; its seconds are recorded per part ("warmup"). A 2026-11-26 run
measured a capacity of 0.44 requests/s on Llama-3.2-1B because its first requests compiled.

Rates: few (two by default), each held for --hold-seconds of arrivals or --hold-requests
requests, whichever comes first (15 s / 300), so that a P99 is a percentile of hundreds;
each row reports its requests, those completed and the seconds it was held. The rates are
the first system's burst capacity times --rate-factors, the same for every system.

The graph check (CUDA, --graphs-check): beside stock's and ours' engines a second engine of
each starts with prefill graphs off and answers the same correctness cases (sglang #37606:
breakable graphs gave wrong greedy output when a bucket's memory was reused); if either
system's two engines differ by more than GRAPH_CHECK_TOLERANCE, both systems' load parts
run on their graphs-off engines, and the results say why; otherwise those engines exit
before the load parts. A system whose graph engine failed to start runs on its second.

Diagnostics: each engine's resolved features, whether prefill-only KV is active (and why
not), the JCT scheduler's job-time model and where it came from, and its start warnings
(results.json "engines"); per rate the forwards, their tokens and the share of packed
followers; the forward and hybrid-prefilling logs and every child's reports in
diagnostics.tar.gz beside the results; SGLang's warnings in the log (level "warning").

CUDA graphs (CUDA only; a CPU engine has none): decode graphs off for every system: a
scoring request never decodes, and their capture needs FlashInfer's decode kernels, which
the kit does not carry. Prefill graphs as a CUDA install of SGLang 0.5.23 runs them:
"breakable" (segments captured between eager attention calls, buckets of 4 to
chunked_prefill_size tokens; a batch of more tokens, or padded past 2x, runs eager), left
to SGLang's own default and compatibility rules; it needs cuda-python, which the lent
cards have. stock-mis: off, by SGLang (--enable-mis turns them off). ours: the same as
stock: hybrid prefilling chunks only forwards longer than stock's largest batch
(hybrid_prefill/settings.whole_limit), which no bucket captures; those (the unchunked
long prompts) run eager in every system. (Until 2026-11-27 ours capped its buckets at the
2048-token layer chunk and ran every longer batch eager in query chunks: on the H200 that
served 14 items requests/s to stock's 57.) A system whose
engine fails to start with prefill graphs is started once more without them, alone, and
the results say so.

Time: every system of a model starts at once (--overlap, the default: engine start-up,
graph capture, correctness and warm-up of the three (and the graph check's two) in
parallel, each engine's KV pool bounded to --pool-tokens so they share the card), then the
timed parts run one system at a time while the others idle (sleep_on_idle: an idle
scheduler waits on its socket instead of spinning a core). Parts are measured part by
part (items on stock, ours, stock-mis; then recommendation on stock and ours; then the
late correctness case), each model gets an equal share of --deadline, no turn starts that
cannot do its burst and first rate before its share (turn_seconds), no rate that cannot
end, and a child still running at --deadline + 20 s is killed: the call ends in time and
says what it left out. --quick: Qwen3-0.6B, correctness, items and recommendation, done
370 s after its start (the device call: 420 s with the kit's install).

The script is this entry point (its command line and main) and its pieces, one module per
job, in benchmarks/card_engine/: systems.py (the systems, their settings and engines),
model.py (the random-weight model and its references), workloads.py (the requests),
parts.py (what a child runs on its engine), diagnostics.py (forward logs, the archive),
report.py (results.json / results.md), cli.py (the arguments) and orchestration.py (the
child processes and the parent that hands out their turns).

Token ids are random (seeded), below the tokenizer's size (the tiny models' tokenizer:
SGLang's score API refuses ids past it): the weights are random too, so text would mean
nothing; what is measured is the work, the cache and the scheduling.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from card_engine.cli import parse_args as _parse_args  # noqa: E402
from card_engine.orchestration import ModelRun, run_system  # noqa: E402
from card_engine.report import markdown  # noqa: E402
from card_engine.systems import pool_for_the_card  # noqa: E402


def parse_args(argv):
    """The command line (card_engine/cli.py), described by this module's docstring."""
    return _parse_args(argv, __doc__)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.device == "cuda":
        # Hybrid prefilling's layers attend through FlashInfer's query chunks: the path
        # this run exists to measure (machine/environment.py: opt-in until it has run on a card).
        os.environ.setdefault("PREFILLONLY_CUDA_QUERY_CHUNKS", "1")
    if args.system:
        return run_system(args)
    args.argv = argv
    if args.device == "cuda" and args.graphs_check and args.pool_tokens is None:
        args.sizes["pool_tokens"] = pool_for_the_card(args.sizes["pool_tokens"])
    started = time.perf_counter()
    args.ends_at = time.time() + args.deadline

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    several = len(args.models) > 1
    runs = {}
    for i, model in enumerate(args.models):
        # Each model its equal share of what is left (the last one: all of it).
        ends = time.time() + (args.ends_at - time.time()) / (len(args.models) - i)
        args.model = model
        out = args.out / model if several else args.out
        runs[model] = ModelRun(args, model, out, started, ends, log).run()
        log(f"{model}: results in {out}")
    if several:
        args.out.mkdir(parents=True, exist_ok=True)
        text = "\n".join(markdown(r) for r in runs.values())
        (args.out / "results.md").write_text(text)
    for results in runs.values():
        print(markdown(results))
    log(f"done; results in {args.out}")
    failed = [e for r in runs.values() for e in r["errors"].values()]
    return 1 if any(not e.startswith("not started") for e in failed) else 0


if __name__ == "__main__":
    sys.exit(main())
