"""The engine kit's boot (prefillonly_sgl/sglang_runtime/cuda_kit_support): what a card
without sgl-kernel runs at interpreter start. Each check runs in a fresh interpreter that
runs the boot first, as the kit's sitecustomize.py does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

BOOT = (
    Path(__file__).resolve().parents[1]
    / "prefillonly_sgl"
    / "sglang_runtime"
    / "cuda_kit_support"
    / "boot.py"
)


def _run_booted(code: str, path: list[Path] = (), env: dict | None = None) -> dict:
    """Runs `code` after the boot in a fresh interpreter; `code` prints one JSON value."""
    program = f"import runpy; runpy.run_path({str(BOOT)!r})\n{code}"
    environ = {**os.environ, **(env or {})}
    if path:
        environ["PYTHONPATH"] = os.pathsep.join([*map(str, path), environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=environ, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sgl_kernel_is_a_stand_in_package_whose_kernels_raise_when_called():
    got = _run_booted(
        "import json, sgl_kernel\n"
        "from sgl_kernel.kvcacheio import transfer_kv_direct\n"
        "from sgl_kernel.scalar_type import scalar_types\n"
        "from sgl_kernel.utils import is_arch_support_pdl\n"
        "uint4 = scalar_types.uint4b8  # read at import by SGLang's quantization modules\n"
        "try:\n"
        "    transfer_kv_direct(1, 2)\n"
        "    raised = ''\n"
        "except NotImplementedError as e:\n"
        "    raised = str(e)\n"
        "print(json.dumps([sgl_kernel.__path__, is_arch_support_pdl(), "
        "raised, repr(uint4)]))"
    )
    path, pdl, raised, uint4 = got
    assert path == [] and pdl is False
    assert "transfer_kv_direct" in raised and "without an sgl-kernel build" in raised
    assert "scalar_types.uint4b8" in uint4


def test_sglang_switches_are_defaults_that_a_set_value_overrides():
    code = (
        "import json, os\n"
        "print(json.dumps({k: os.environ.get(k) for k in ("
        "'SGLANG_FORCE_FUSED_OP_BACKEND', 'SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK', "
        "'SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND')}))"
    )
    unset = {k: "" for k in ("SGLANG_FORCE_FUSED_OP_BACKEND",)}
    got = _run_booted(code, env=unset | {"SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND": "rust"})
    assert got["SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK"] == "1"
    assert got["SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND"] == "rust"  # the user's value wins
    assert got["SGLANG_FORCE_FUSED_OP_BACKEND"] == ""  # set (even empty): left alone


def _fake_flashinfer(root: Path, with_fa3: bool) -> Path:
    package = root / "flashinfer"
    (package / "data" / "csrc").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text(
        "def determine_attention_backend(*args, **kwargs):\n    return 'fa3'\n"
    )
    (package / "prefill.py").write_text("from .utils import determine_attention_backend\n")
    if with_fa3:
        (package / "data" / "csrc" / "batch_prefill_sm90.cu").write_text("")
    return root


def test_flashinfer_auto_answers_fa2_only_where_fa3_sources_are_missing(tmp_path):
    code = (
        "import json, flashinfer.prefill as p\n"
        "print(json.dumps(p.determine_attention_backend(None, 0, False, False, None, None)))"
    )
    trimmed = _fake_flashinfer(tmp_path / "trimmed", with_fa3=False)
    whole = _fake_flashinfer(tmp_path / "whole", with_fa3=True)
    assert _run_booted(code, [trimmed]) == "fa2"
    assert _run_booted(code, [whole]) == "fa3"


def test_dual_gemm_is_not_selected_without_cutlass():
    """SGLang's Qwen MLPs build a DualGemm on CUDA, whose mode selection imports the CuTe
    DSL kernel (nvidia-cutlass-dsl); the card's image lacks it (the first card run's
    scheduler failed there)."""
    got = _run_booted(
        "import json, importlib.util\n"
        "from sglang.srt.layers.dual_gemm import DualGemm\n"
        "print(json.dumps([importlib.util.find_spec('cutlass') is None, "
        "DualGemm._select_mode.__name__, DualGemm._select_mode(None, None, 64)]))"
    )
    assert got == [True, "_no_dual_gemm", None]
