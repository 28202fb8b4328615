"""The engine kit's part of the GPU kit (build.py calls it): what `prefillonly_sgl.Engine`
needs on a card that has torch, triton, transformers and nvcc but no SGLang, no
sgl-kernel, no network.

    sglang.tar.xz      SGLang's cp312 wheel, unpacked and trimmed: its diffusion server
                       (multimodal_gen), the Rust extensions the engine never loads
                       (_server, _grpc, _multimodal, _bench: 40 MB) and the Rust radix
                       tree (built against torch 2.14) left out
    engine-wheels/     cp312 wheels of the distributions the engine's processes import
                       (probe_engine_imports.py asks SGLang's CUDA path itself) that the
                       card's image does not hold (CARD_HAS), at the versions this
                       project's CPU install runs and tests

sgl-kernel's CUDA ops are not carried: prefillonly_sgl/sglang_runtime/cuda_kit_support
serves `sgl_kernel` as a stand-in and runs SGLang's fused ops on their torch paths.
"""

from __future__ import annotations

import shutil
import tarfile
import zipfile
from pathlib import Path

SGLANG = "sglang==0.5.23"
# Left out of SGLang's wheel: the diffusion server and the Rust extensions only its Rust
# HTTP server, gRPC, multimodal processors and benchmarks load, and the Rust radix tree's
# (built against torch 2.14; the kit's boot selects SGLang's Python tree on the card's
# torch 2.11).
SGLANG_LEFT_OUT = (
    "sglang/multimodal_gen/",
    "sglang/srt/mem_cache/rust_tree_core/mem_cache.",
    "sglang/srt/rust_extensions/_server.",
    "sglang/srt/rust_extensions/_grpc.",
    "sglang/srt/rust_extensions/_multimodal.",
    "sglang/srt/rust_extensions/_bench.",
)
# Distributions the lent machines' image holds (the device tool's KINDS.md, "Python
# packages already there", read 2026-11-17), by their normalized names: not carried.
# install.py unpacks a carried wheel only where its modules are missing anyway; this list
# only keeps the kit small. transformers is there (5.17.0; SGLang asks for 5.19.0 and
# runs on 5.17: the dress rehearsal, benchmarks/README.md).
CARD_HAS = frozenset(
    """
    accelerate aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
    charset-normalizer click cloudpickle colorama cuda-bindings cuda-core cuda-pathfinder
    einops filelock frozenlist fsspec h11 hf-xet httpcore httpx huggingface-hub idna
    jinja2 joblib markupsafe mpmath msgpack multidict narwhals networkx ninja numpy
    nvidia-ml-py packaging pandas pillow prometheus-client propcache protobuf psutil
    pyarrow pygments python-dateutil pyyaml regex requests rich safetensors scikit-learn
    scipy sentencepiece six sympy tabulate threadpoolctl tiktoken tokenizers torch
    torchvision tqdm transformers triton typing-extensions urllib3 uvloop xxhash yarl
    """.split()
)
# Carried elsewhere or not at all: the project (the tree itself), SGLang (sglang.tar.xz),
# FlashInfer and its tvm-ffi (the GPU kit's part).
NOT_WHEELS = frozenset({"prefillonly-sgl", "sglang", "flashinfer-python", "apache-tvm-ffi"})


def normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def wheels_to_carry(distributions: dict[str, str]) -> list[str]:
    """pip requirements (name==version) for the probed distributions the card lacks."""
    return sorted(
        f"{name}=={version}"
        for name, version in distributions.items()
        if normalized(name) not in CARD_HAS and normalized(name) not in NOT_WHEELS
    )


def write_sglang(wheel: Path, archive: Path) -> dict:
    """SGLang's wheel as a trimmed tar.xz (its dist-info kept: SGLang reads its version)."""
    kept = left = 0
    kept_bytes = 0
    # preset 1: 3 s for 10 MB here, against 34 s for 8 MB at 6 (the kit has room)
    with zipfile.ZipFile(wheel) as source, tarfile.open(archive, "w:xz", preset=1) as tar:
        for info in source.infolist():
            if info.is_dir():
                continue
            if info.filename.startswith(SGLANG_LEFT_OUT) or "/__pycache__/" in info.filename:
                left += 1
                continue
            member = tarfile.TarInfo(info.filename)
            member.size = info.file_size
            member.mode = 0o755 if info.filename.endswith(".so") else 0o644
            with source.open(info) as data:
                tar.addfile(member, data)
            kept += 1
            kept_bytes += info.file_size
    return {
        "sglang_files_kept": kept,
        "sglang_files_left_out": left,
        "sglang_kept_mib": round(kept_bytes / (1 << 20), 1),
    }


def build_engine_part(kit: Path, work: Path, distributions: dict[str, str], pip_download) -> dict:
    """Writes sglang.tar.xz and engine-wheels/ into the kit; returns the manifest's part."""
    pip_download([SGLANG], work / "sglang-wheel", platforms=("manylinux_2_34_x86_64",))
    wheel = next((work / "sglang-wheel").glob("sglang-*.whl"))
    part = write_sglang(wheel, kit / "sglang.tar.xz")
    wheels = kit / "engine-wheels"
    if wheels.exists():
        shutil.rmtree(wheels)
    wanted = wheels_to_carry(distributions)
    pip_download(wanted, wheels)
    part["engine_wheels"] = sorted(p.name for p in wheels.glob("*.whl"))
    part["engine_distributions_probed"] = len(distributions)
    return part
