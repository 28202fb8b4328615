#!/usr/bin/env bash
# The GPU step of issue 48, one command on a lent GPU machine (no network, no SGLang):
# installs the kit (built here by scripts/gpu_kit/build.py, carried as build/gpu_kit) into
# /tmp/gpukit and runs benchmarks/gpu_prefill.py, writing results.json / results.md and
# the log to $OUT/gpu_prefill (the device tool brings $OUT back).
#
#   device run: command "bash scripts/gpu_kit/run_on_card.sh", carry ["build/gpu_kit"],
#               timeout_s 420 (the script starts no part after 300 s; ~4 min expected)
#
# Extra arguments go to gpu_prefill.py (e.g. --layers 16, --parts hybrid,kv); PYTHON names
# the interpreter that has torch (default python3).
#
# --engine first: the engine kit's run (issues 57, 62, 73, 83) instead,
# benchmarks/gpu_engine.py (the Engine, its variants, stock SGLang and stock with
# --enable-mis on the card) -> $OUT/gpu_engine:
#   device run: command "bash scripts/gpu_kit/run_on_card.sh --engine --quick", carry
#               ["build/gpu_kit", "build/gpu_checks"], timeout_s 570 (Qwen3-0.6B: the
#               items grid first, recommendation, the profile, correctness, and the card
#               checks as side jobs; the script is done by 490 s after its start, its
#               children killed by 510, the kit's install ~15-20 s before: <= 540 s in all)
#   -> $OUT/gpu_engine/{results.json, results.md, log.txt, diagnostics.tar.gz,
#      checks.json, checks.md, query_chunk_test.txt}
# (--engine --model llama-3.2-1b: one model, every part but the checks, 540 s.) Rehearsed
# on CPU as PREFILLONLY_DEVICE=cpu PYTHON=.venv/bin/python OUT=/tmp/reh bash
# scripts/gpu_kit/run_on_card.sh --engine --quick --tiny --device cpu (benchmarks/README.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
KIT=${KIT:-build/gpu_kit}
PREFIX=${PREFIX:-/tmp/gpukit}
PYTHON=${PYTHON:-python3}
SCRIPT=benchmarks/gpu_prefill.py
NAME=gpu_prefill
if [[ "${1:-}" == "--engine" ]]; then
    shift
    SCRIPT=benchmarks/gpu_engine.py
    NAME=gpu_engine
elif [[ "${1:-}" == "--checks" ]]; then
    # benchmarks/gpu_checks.py: heads, LoRA, gpt-oss sinks against transformers; carry
    # ["build/gpu_kit", "build/gpu_checks"] (the adapters: gpu_checks.py --prepare)
    shift
    SCRIPT=benchmarks/gpu_checks.py
    NAME=gpu_checks
fi
RESULTS=${OUT:-benchmarks/results}/$NAME
mkdir -p "$RESULTS"
{
  echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
  echo "== nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none); ninja: $(command -v ninja || echo none)"
  echo "== $("$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1)"
  "$PYTHON" scripts/gpu_kit/install.py --kit "$KIT" --into "$PREFIX"
  export PATH="$PREFIX/bin:$PATH"
  export PYTHONPATH="$PREFIX/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  export FLASHINFER_WORKSPACE_BASE="$PREFIX/workspace"
  export TVM_FFI_CACHE_DIR="$PREFIX/tvm-ffi"
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  export PYTHONUNBUFFERED=1
  "$PYTHON" "$SCRIPT" --out "$RESULTS" "$@"
} 2>&1 | tee "$RESULTS/log.txt"
exit "${PIPESTATUS[0]}"
