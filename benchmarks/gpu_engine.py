"""The engine itself on a card (issues 57, 62, 73 and 83): prefillonly's Engine against
stock SGLang at its best per shape, side by side on the same card, model and attention
backend (FlashInfer).

    # on a lent card, through the engine kit (benchmarks/README.md, "The engine on a card"):
    bash scripts/gpu_kit/run_on_card.sh --engine --quick      # the first call: <= 540 s
    #   device run: carry ["build/gpu_kit", "build/gpu_checks"], timeout_s 570
    bash scripts/gpu_kit/run_on_card.sh --engine --model llama-3.2-1b   # one model, all parts
    # here, what the tests run (tiny shapes, CPU, float32):
    .venv/bin/python benchmarks/gpu_engine.py --tiny --device cpu --out /tmp/gpu_engine
    # the quick call rehearsed on CPU, through the kit (~6-8 min on 2 idle cores):
    PYTHON=.venv/bin/python PREFILLONLY_DEVICE=cpu OUT=/tmp/reh \
        bash scripts/gpu_kit/run_on_card.sh --engine --quick --tiny --device cpu

A random-weight model of a published shape (Qwen3-0.6B: SGLang #9748's model; Llama-3.2-1B)
is written once with transformers (bf16 on a card). The systems, each an Engine in a
process of its own (SGLang ends the process whose engine's worker failed; the run goes on),
their turns in this order:

- "stock": every prefillonly feature off, SGLang's lpm policy (its best for shared prefixes);
- "ours": the defaults (on CUDA: hybrid prefilling's layers through FlashInfer's query
  chunks; the JCT scheduler's batches of whole groups up to max_prefill_tokens, 16,384);
- "stock-mis": stock with SGLang's multi-item scoring (`enable_mis=True`, i.e.
  `--enable-mis`, with `--attention-backend flashinfer`, which it asserts): a request's query
  and items become one sequence, `query <d> item1 <d> item2 ... <d>` (d: SGLang's fixed
  placeholder token, constants.MIS_DELIMITER_TOKEN_ID), one forward under FlashInfer's
  item-aware mask, each item's positions restarting after the query; SGLang turns the radix
  cache, chunked prefill and CUDA graphs off for it. Measured on the items shape (its
  case), for correctness and in the profile; it needs FlashInfer, so off CUDA it is
  skipped, the reason written into the results;
- "ours-8k": ours with `Engine(jct_batch_tokens=8192)`, the forward cap of rounds 1-3
  (issue 83, item 4: 8k against 16k);
- "ours-1pass": ours with PREFILLONLY_CUDA_ONE_PASS=1 in its processes (item 3: a packed
  group's attention in one FlashInfer paged pass under the item mask; CUDA only: on a CPU
  it is ours, and the results say so).

A variant this tree's engine cannot be asked for (no jct_batch_tokens option, no
PREFILLONLY_CUDA_ONE_PASS) is skipped with that reason rather than run as ours.

SGLang's fused elementwise ops (--fused-ops, every system alike; item 5). The kit has no
sgl-kernel, so its boot (prefillonly_sgl/sglang_runtime/cuda_kit_support/boot.py) sets
SGLang's own switch SGLANG_FORCE_FUSED_OP_BACKEND=torch (a default: a value already set
wins). SGLang 0.5.23 reads it once per process (sglang/kernels/fused_op.py,
get_fused_op_backend) as a sglang.kernels.spec.KernelBackend: torch, torch_compile, triton,
jit, aot, cute_dsl, flydsl, helion, KDA, cake, plugin, flashinfer, deepgemm, aiter,
torch_npu; each BaseFusedOp (RMSNorm, SiluAndMul, RotaryEmbedding: every one Qwen3 and
Llama run) then calls its forward_<backend>, falling back to normal dispatch (on CUDA
forward_cuda, i.e. sgl-kernel, the kit's raising stand-in) where an op lacks it. "torch" is
forward_native; "torch_compile" is BaseFusedOp.forward_torch_compile, torch.compile of
forward_native, each op compiled on its own (nothing fused across ops or into the GEMMs).
That is 0.5.23's only torch.compile route for a prefill: --enable-torch-compile compiles
the decode graphs' batch sizes only (decode graphs are off here: a scoring request never
decodes), and its piecewise prefill backend ("tc_piecewise", torch.compile of the whole
model) is not among the prefill graph backends it accepts (full, breakable, disabled).
--fused-ops compile sets SGLANG_FORCE_FUSED_OP_BACKEND=torch_compile in every child (and
TORCHINDUCTOR_COMPILE_THREADS=1: no compile-worker pool per engine); the compiles land in
the breakable graphs' capture warm-ups (each bucket runs twice before its capture) and the
load parts' warm-ups. The fused-ops A/B in one call (--fused-ops-ab, --quick: stock,ours):
an engine of each named system with the other backend (label SYSTEM-compile), measured
beside the grid on what fits: correctness's early cases, the items bursts and the profile
(the per-stage table's norm_rotary_act is the ops in question).

Parts, each written to results.json / results.md as it ends:

- correctness: label log-probabilities (over the whole vocabulary) of cold prompts, a
  shared prefix and its cache hit, a cold query with its items in one call (ours packs the
  items behind the query: one forward, counted from the forward log), and a prompt longer
  than stock's largest batch (ours: one forward, its layers in query chunks; stock: chunked
  prefill; run after the load parts, since it is a first-time kernel path), against a
  float32 transformers forward of the same weights on the same device; stock-mis against
  the sequence it scores (query, delimiter, item at its MIS positions), and, beside it, how
  far that is from query + item's;
- items, first (issue 83, item 8): SGLang #9748's shape, requests of a 120-token query and
  10 items of 180 tokens. Every system's burst of 48 requests, twice (the same requests in
  every system; its capacity: their mean), then a grid of rates from the best system's
  capacity: 0.7, 0.8, 0.9, 1.0, 1.2 and 1.5x, and 0.6x below them (a system whose crossing
  lies under 0.7x still gets a figure), Poisson arrivals, the whole grid twice (pass 1 on
  every system, then pass 2; new requests each pass, the same in every system). Each rate's
  requests are sized so that the grid and the parts after it fit the call (100-300; the
  results state the count and each rate's seconds); a system's pass stops above a rate
  whose p99 is past 2x the bound or that left requests unfinished (the crossing lies below
  it). Items/s at P99 <= 500 ms per pass (interpolated, stats.crossing_rate); **the figure
  is a system's worse pass**, both passes beside it. Every burst also gives the system's
  saturation throughput, in input tokens/s as Prelude (OpenReview 2026) reports it;
- recommendation: the paper's shape scaled to the card: users with 1-2k-token profiles,
  each request one user's profile and 8 items of 150 tokens, every user's requests spread
  over the run; requests/s at P99 <= --rec-p99 seconds, at two rates from the first
  system's burst (stock's), held 15 s or 300 requests (--quick: 6 s or 150);
- profile (item 2): the engine's kernel profile (PREFILLONLY_KERNEL_PROFILE, set in each
  child; forward_profile/kernel_profile.py): armed for 3 forwards, then up to 3 bursts of
  the same 4 items-shaped requests (one ~7.7k-token forward for ours and stock-mis, 8,192 +
  3,808 for stock lpm): per system the per-stage ms (attention, merge, kv_write, gemm,
  norm_rotary_act, logits, other), each stage's share and us per token, the device's busy
  and idle (host) time, the top kernels, and per stage ours' excess over stock and over
  stock-mis at ours' forward size. On a CPU the stages are CPU ops';
- long: a cold 32k-token prompt (1.2k with the tiny sizes): time and the scheduler's peak
  memory above what it held before the forward (prefillonly's memory probe, in engines of
  their own so the probe's synchronisation slows no load run), stock (unchunked) against
  ours (hybrid prefilling);
- checks (item 7; side jobs, card_engine/side_checks.py): gpu_checks.py's heads, LoRA per
  request and gpt-oss sinks (each check's process at once) and
  tests/test_flashinfer_query_chunk.py, started with the engines, ended or killed at
  --checks-limit (170 s) before the first timed part; checks.json, checks.md and
  query_chunk_test.txt beside the results. LoRA's adapters: build/gpu_checks (carried), or
  written on the card where peft imports.

Warm-up: after its engine starts (and after correctness, which is not timed), each system
runs representative requests of every load part's shape (a burst, a second burst, a single
request; the recommendation's with warm-up users of their own, a miss then a hit each) so
that no JIT compile (FlashInfer, Triton, SGLang's kernels, torch.compile) lands in a burst
probe or a timed rate; its seconds are recorded per part ("warmup"). A 2026-11-26 run
measured a capacity of 0.44 requests/s on Llama-3.2-1B because its first requests compiled.

The graph check (CUDA, --graphs-check): beside stock's and ours' engines a second engine of
each starts with prefill graphs off and answers the same correctness cases (sglang #37606:
breakable graphs gave wrong greedy output when a bucket's memory was reused); if either
system's two engines differ by more than GRAPH_CHECK_TOLERANCE, both systems' load parts
run on their graphs-off engines, and the results say why; otherwise those engines exit
before the load parts. A system whose graph engine failed to start runs on its second.

CUDA graphs (CUDA only; a CPU engine has none): decode graphs off for every system: a
scoring request never decodes, and their capture needs FlashInfer's decode kernels, which
the kit does not carry. Prefill graphs as a CUDA install of SGLang 0.5.23 runs them:
"breakable" (segments captured between eager attention calls, buckets of 4 to
chunked_prefill_size tokens; a batch of more tokens, or padded past 2x, runs eager), left
to SGLang's own default and compatibility rules; it needs cuda-python, which the lent
cards have. stock-mis: off, by SGLang (--enable-mis turns them off). ours: SGLang's, its
buckets following the JCT scheduler's batch budget (up to max_prefill_tokens on CUDA;
ours-8k's to 8,192); hybrid prefilling chunks only forwards longer than that, which no
bucket captures; those (the unchunked long prompts) run eager in every system. (Until
2026-11-27 ours capped its buckets at the 2048-token layer chunk and ran every longer
batch eager in query chunks: on the H200 that served 14 items requests/s to stock's 57.)
A system whose engine fails to start with prefill graphs is started once more without
them, alone, and the results say so. The resolved buckets are in the Systems table.

Diagnostics: each engine's resolved features, whether prefill-only KV is active (and why
not), the JCT scheduler's job-time model and settings (its batch budget), and its start
warnings (results.json "engines"); per rate the forwards, their tokens and the share of
packed followers; per engine and part (item 1; results "forwards", diagnostics.
forward_report) its forwards from the forward log, bucketed by computed tokens (<=2k,
2-4k, 4-6k, 6-8k, 8-12k, 12-16k, >16k: ours' 7,680-token forward beside stock's 8,192),
with device us per computed token (the log's device_ms, CUDA only; "no device timing"
elsewhere), host ms per forward (run_batch's step_s) and cycle ms (the gap between two
forwards' launches inside a burst), and a roofline: FLOPs (2 x linear weights per token +
4 x heads x head_dim x layers per causal query-key pair, multi-item scoring's by its item
mask + the LM head per scored row) per device second and per second of burst wall, and
their share of the card's dense bf16 peak (H100 / H200: 989 TFLOP/s); the forward, hybrid
and kernel-profile logs, every child's reports and the checks' logs in diagnostics.tar.gz
beside the results; SGLang's warnings in the log (level "warning").

Time: every system of a model starts at once (--overlap, the default: engine start-up,
graph capture, correctness and warm-up in parallel, each engine's KV pool bounded to
--pool-tokens so they share the card: 131,072 tokens for up to five engines, the same 70
GiB shared by more), then the timed parts run one system at a time while the others idle
(sleep_on_idle: an idle scheduler waits on its socket instead of spinning a core): the
items grid, the recommendation, the fused-ops A/B bursts, the profile, correctness's late
case. Each model gets an equal share of --deadline, no turn starts that cannot do its
least before its share, no rate that cannot end, and a child still running at --deadline +
20 s is killed: the call ends in time and says what it left out. --quick: Qwen3-0.6B,
parts correctness, items, recommendation, profile and checks, every system, the fused-ops
A/B for stock and ours, no graph check (two H200 runs: 1.95e-2 on/off for both; --graphs-
check to run it), done 490 s after its start, killed children by 510 s: the device call
ends within 540 s with the kit's install. Expected, per stage (seconds from the call's
start; the 2026-11-28 H200 logs: engines up in 47-105 s, five at once):

    install the kit (run_on_card.sh)                        0-20
    card checks start (side jobs, killed at 170 s)          20
    model written, float32 references                       20-35
    7 engines start together (5 systems + 2 A/B), their
      correctness and warm-ups; ready                       35-~170
    card checks done                                        <= 190
    items bursts: 5 systems x 2 x 48 requests               190-205
    items grid: 7 rates x 5 systems x 2 passes, each
      rate's requests sized to what is left (~120)          205-377
    recommendation: 4 systems x (burst + 2 rates)           377-417
    fused-ops A/B: 2 engines' bursts                        417-425
    profile: 7 engines x (arm + <= 3 bursts of 4)           425-460
    correctness's late case (10k tokens): 5 engines         460-500
    engines exit, diagnostics                               500-510
    the script's deadline (490 + 20 s of install)           510
    children still alive killed (20 s of grace): the end    <= 530 (limit 540)

The grid is sized when its rates are known (orchestration.grid_requests): what is left to
the deadline less the parts after it (sizes' reserve: 10 s a recommendation turn, 4 an A/B
burst turn, 5 a profile turn, 20 + 4 a late case, 10 the exit); a slow start shortens the
holds, never the parts after the grid.

The script is this entry point (its command line and main) and its pieces, one module per
job, in benchmarks/card_engine/: systems.py (the systems, their settings and engines),
model.py (the random-weight model and its references), workloads.py (the requests),
parts.py (what a child runs on its engine), diagnostics.py (forward logs and their report,
the profile's summary, the archive), report.py (results.json / results.md), cli.py (the
arguments), side_checks.py (the card checks) and orchestration.py (the child processes and
the parent that hands out their turns).

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
from card_engine.side_checks import SideChecks  # noqa: E402
from card_engine.systems import GRAPH_CHECKED, SYSTEM_PARTS, pool_for_the_card  # noqa: E402


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
    if args.device == "cuda" and args.pool_tokens is None:
        args.sizes["pool_tokens"] = pool_for_the_card(args.sizes["pool_tokens"], engines(args))
    started = time.perf_counter()
    args.ends_at = time.time() + args.deadline

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f} s] {message}", flush=True)

    args.work.mkdir(parents=True, exist_ok=True)
    # the card checks: side jobs that start with the engines, done before the timed parts
    side = SideChecks(args, log) if "checks" in args.parts else None
    several = len(args.models) > 1
    runs = {}
    for i, model in enumerate(args.models):
        # Each model its equal share of what is left (the last one: all of it).
        ends = time.time() + (args.ends_at - time.time()) / (len(args.models) - i)
        args.model = model
        out = args.out / model if several else args.out
        run = ModelRun(args, model, out, started, ends, log)
        run.side = side
        runs[model] = run.run()
        if side is not None and not side.done:  # no engine part waited for them
            run.wait_side()
            run.save()
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


def engines(args) -> int:
    """How many engines share the card while they start: the systems, the graph check's
    second engines, the fused-ops A/B's (their pools are sized by it)."""
    systems = [s for s in args.systems if set(args.parts) & set(SYSTEM_PARTS[s]) - {"long"}]
    checked = [s for s in systems if s in GRAPH_CHECKED] if args.graphs_check else []
    return len(systems) + len(checked) + len(set(args.fused_ops_ab) & set(systems))


if __name__ == "__main__":
    sys.exit(main())
