"""Asks flashinfer itself what the kit's kernels compile from (run by build.py, in a child
process whose path holds the unpacked flashinfer wheel; no GPU needed).

It imports flashinfer, then generates the JIT specs that the project's FlashInfer query
chunks (features/prefill_attention/flashinfer_chunk.py) build at their first plan: FA2
batch prefill (ragged and paged; the paged module with independent K / V strides that FA2
builds lazily) and merge_state's cascade module, for the benchmark's dtype and head dim.
An audit hook records every file flashinfer opens meanwhile (its jinja templates and the
sources it copies), and the compiler's include directories are read from flashinfer's own
flag builder. Writes one JSON object to the path given.

With --build it also compiles the specs (nvcc, for FLASHINFER_CUDA_ARCH_LIST): run against
the unpacked kit, that proves the trimmed tree holds every file the kernels compile from
(build.py --compile-check; a GPU is not needed to compile).

    python probe_specs.py OUT.json [--dtype bfloat16] [--head-dim 128] [--build]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

OPENED: set[str] = set()


def _record_open(event: str, args: tuple) -> None:
    if event == "open" and isinstance(args[0], str):
        OPENED.add(os.path.realpath(args[0]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--build", action="store_true", help="compile the specs too")
    args = parser.parse_args()
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")  # no GPU here to detect
    sys.addaudithook(_record_open)

    import flashinfer
    import torch
    from flashinfer.jit import cpp_ext
    from flashinfer.jit.attention import modules
    from flashinfer.jit.cascade import gen_cascade_module

    dtype = getattr(torch, args.dtype)
    # get_batch_prefill_module("fa2", ...)'s arguments as the wrappers' plan() passes them:
    # q / kv / o dtype, index dtype, head dims, no rope, no sliding window, no soft cap,
    # no fp16 qk reduction.
    fa2 = (
        "fa2",
        dtype,
        dtype,
        dtype,
        torch.int32,
        args.head_dim,
        args.head_dim,
        0,
        False,
        False,
        False,
    )
    specs = [
        modules._gen_batch_prefill_primary_module(*fa2),
        modules._gen_batch_prefill_independent_paged_module(*fa2),
        gen_cascade_module(),
    ]
    built = {}
    if args.build:
        for spec in specs:
            started = time.perf_counter()
            spec.build()
            built[spec.name] = {
                "seconds": round(time.perf_counter() - started, 1),
                "library": str(spec.get_library_path()),
            }
    include_dirs = []
    for spec in specs:
        for flag in cpp_ext.build_common_cflags("/usr/local/cuda", spec.extra_include_dirs):
            for prefix in ("-isystem ", "-I"):
                if flag.startswith(prefix):
                    path = flag[len(prefix) :].strip()
                    if path not in include_dirs:
                        include_dirs.append(path)
    package = os.path.dirname(os.path.realpath(flashinfer.__file__))
    modules_loaded = sorted(
        os.path.realpath(m.__file__)
        for m in list(sys.modules.values())
        if getattr(m, "__file__", None) and os.path.realpath(m.__file__).startswith(package)
    )
    result = {
        "flashinfer_version": flashinfer.__version__,
        "package_dir": package,
        "specs": [{"name": s.name, "sources": [str(p) for p in s.sources]} for s in specs],
        "include_dirs": include_dirs,
        "opened": sorted(p for p in OPENED if p.startswith(package)),
        "modules": modules_loaded,
        "built": built,
    }
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
