"""Asks SGLang and the project what their CUDA path imports (run by build.py in a child
process; no GPU needed): which of FlashInfer's Python modules, and which third-party
distributions, the engine's processes load on a CUDA machine.

SGLang decides at import time whether it runs on CUDA (`torch.cuda.is_available()`, the
device's name and capability), and imports FlashInfer's subpackages and its CUDA-only
modules only then. This probe answers those questions as a Hopper card would (an H100's
name and capability 9.0; nothing is ever launched), activates the engine kit's boot
(prefillonly_sgl/sglang_runtime/cuda_kit_support: the sgl_kernel stand-in) and imports
what the engine's main, scheduler and detokenizer processes import. Writes one JSON
object: the FlashInfer module files loaded, and {distribution: version} of every
non-standard-library module loaded.

    python probe_engine_imports.py OUT.json
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import runpy
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What SGLang's Engine and prefillonly's runtime import in their processes (main,
# scheduler with the model runner and the attention backends, detokenizer), and the model
# families the card runs.
ENGINE_MODULES = (
    "sglang.srt.entrypoints.engine",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.layers.attention.flashinfer_backend",
    "sglang.srt.layers.attention.triton_backend",
    "sglang.srt.models.llama",
    "sglang.srt.models.qwen2",
    "sglang.srt.models.qwen3",
    "prefillonly_sgl.engine",
    "prefillonly_sgl.sglang_runtime.plugin",
    "prefillonly_sgl.sglang_runtime.offline_engine",
    "prefillonly_sgl.sglang_runtime.score_front",
    "prefillonly_sgl.features.prefill_attention.scheduler_flashinfer_backend",
    "prefillonly_sgl.features.prefill_kv.scheduler_process",
    "prefillonly_sgl.features.jct_scheduler.scheduler_process",
    "prefillonly_sgl.features.hybrid_prefill.scheduler_process",
    "prefillonly_sgl.features.prompt_logprobs.scheduler_process",
    "prefillonly_sgl.verification.reference",
)
HOPPER = types.SimpleNamespace(
    name="NVIDIA H100 80GB HBM3",
    major=9,
    minor=0,
    total_memory=80 << 30,
    multi_processor_count=132,
    L2_cache_size=50 << 20,
    gcnArchName="",
    uuid="probe",
)


def answer_as_a_card() -> None:
    """torch's device questions answered as an H100 with CUDA 13 would (import-time
    decisions only)."""
    import torch

    torch.version.cuda = torch.version.cuda or "13.0"  # a CPU build says None: the card's
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_name = lambda *args, **kwargs: HOPPER.name
    torch.cuda.get_device_capability = lambda *args, **kwargs: (HOPPER.major, HOPPER.minor)
    torch.cuda.get_device_properties = lambda *args, **kwargs: HOPPER


def distributions_loaded() -> dict[str, str]:
    """{distribution: version} of the loaded modules outside the standard library."""
    owners = importlib.metadata.packages_distributions()
    found = {}
    for name in list(sys.modules):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names:
            continue  # (a distribution's private modules, e.g. cffi's _cffi_backend, count)
        for dist in owners.get(top, ()):
            try:
                found[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                continue
    return dict(sorted(found.items()))


def main() -> None:
    out = Path(sys.argv[1])
    # A CPU install's .pth (cpu_support) chose SGLang's CPU path for this interpreter;
    # the card's path is CUDA.
    os.environ.pop("SGLANG_USE_CPU_ENGINE", None)
    sys.path.insert(0, str(REPO))
    runpy.run_path(str(REPO / "prefillonly_sgl/sglang_runtime/cuda_kit_support/boot.py"))
    answer_as_a_card()
    for module in ENGINE_MODULES:
        importlib.import_module(module)
    flashinfer_files = sorted(
        str(Path(m.__file__).resolve())
        for name, m in list(sys.modules.items())
        if name.partition(".")[0] == "flashinfer" and getattr(m, "__file__", None)
    )
    out.write_text(
        json.dumps(
            {"flashinfer_files": flashinfer_files, "distributions": distributions_loaded()},
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
