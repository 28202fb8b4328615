"""The GPU kit (scripts/gpu_kit/): the include walk that trims flashinfer, the installer a
lent machine runs, and the builder itself against the real flashinfer and SGLang wheels
(downloaded from the package registry) with its size limit, then the card's two commands
(run_on_card.sh, and with --engine) on that kit with tiny shapes on CPU. Compiling the kit's kernels
(build.py --compile-check, ~75 s of nvcc on 2 cores) is left to the hand run recorded in
benchmarks/README.md."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

KIT_SCRIPTS = Path(__file__).resolve().parents[1] / "scripts" / "gpu_kit"
sys.path.insert(0, str(KIT_SCRIPTS))

import install  # noqa: E402
from include_closure import include_closure  # noqa: E402


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_include_closure_follows_the_compilers_search_order(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    source = _write(
        tmp_path / "src" / "kernel.cu",
        '#include "local.cuh"\n#include <lib/a.h>\n  #  include <cuda_runtime.h>\n'
        "#if 0\n#include <lib/only_if.h>\n#endif\n#include SOME_HEADER\n",
    )
    _write(tmp_path / "src" / "local.cuh", "#include <lib/b.h>\n")
    _write(first / "lib" / "a.h", '#include "c.h"\n')  # beside a.h, before the dirs
    _write(first / "lib" / "c.h", "")
    _write(second / "lib" / "a.h", "never read: first/ comes first\n")
    _write(second / "lib" / "b.h", "#include <lib/a.h>\n")  # a cycle back to a.h
    _write(second / "lib" / "only_if.h", "")
    closure = include_closure([source], [first, second])
    names = {str(p.relative_to(tmp_path)) for p in closure.files}
    assert names == {
        "src/kernel.cu",
        "src/local.cuh",
        "first/lib/a.h",
        "first/lib/c.h",
        "second/lib/b.h",
        "second/lib/only_if.h",  # behind #if 0: followed anyway (more, never fewer)
    }
    assert closure.unresolved == {"cuda_runtime.h"}
    assert closure.macro_includes == {(str(source.resolve()), "SOME_HEADER")}


def _wheel(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return path


def test_install_unpacks_flashinfer_and_only_the_missing_wheels(tmp_path):
    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    with tarfile.open(kit / "flashinfer.tar.xz", "w:xz") as tar:
        data = b"VERSION = 'kit'\n"
        info = tarfile.TarInfo("flashinfer/__init__.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    _wheel(
        kit / "wheels" / "kitonly_mod-1.0-py3-none-any.whl",
        {"kitonly_mod/__init__.py": "X = 1\n", "kitonly_mod-1.0.dist-info/RECORD": ""},
    )
    _wheel(  # pytest is importable here: its wheel must not be unpacked over it
        kit / "wheels" / "pytest-0.0-py3-none-any.whl",
        {"pytest/__init__.py": "raise ImportError('the kit shadowed pytest')\n"},
    )
    into = tmp_path / "gpukit"
    done = install.install(kit, into)
    assert done == ["flashinfer (trimmed)", "kitonly_mod-1.0-py3-none-any.whl"]
    assert (into / "site" / "flashinfer" / "__init__.py").read_text() == "VERSION = 'kit'\n"
    assert (into / "site" / "kitonly_mod" / "__init__.py").exists()
    assert not (into / "site" / "pytest").exists()


def test_install_writes_the_ninja_program_only_where_path_has_none(tmp_path, monkeypatch):
    kit = tmp_path / "kit"
    (kit / "wheels").mkdir(parents=True)
    with tarfile.open(kit / "flashinfer.tar.xz", "w:xz"):
        pass
    program = "#!/bin/sh\necho 1.13.2\n"
    _wheel(
        kit / "wheels" / "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl",
        {"ninja/__init__.py": "", "ninja-1.13.2.data/scripts/ninja": program},
    )
    monkeypatch.setattr(install.shutil, "which", lambda name: "/usr/bin/" + name)
    assert install.install(kit, tmp_path / "with") == ["flashinfer (trimmed)"]
    monkeypatch.setattr(install.shutil, "which", lambda name: None)
    done = install.install(kit, tmp_path / "without")
    assert done[1] == "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl (the ninja program)"
    ninja = tmp_path / "without" / "bin" / "ninja"
    assert subprocess.run([str(ninja)], capture_output=True, text=True).stdout == "1.13.2\n"


def test_install_declares_the_sglang_plugin_where_no_distribution_does(tmp_path, monkeypatch):
    """On a card the tree travels without its egg-info: without a declared entry point
    SGLang loads no plugin and every process runs stock (the 2026-11-26 H200 run)."""
    site = tmp_path / "site"
    site.mkdir()
    assert install.declare_plugin(site) == []  # this install declares it already
    monkeypatch.setattr(install.importlib.metadata, "entry_points", lambda group: [])
    done = install.declare_plugin(site)
    assert done == ["prefillonly_sgl-0.1.0.dist-info (declares the SGLang plugin prefillonly)"]
    (dist,) = install.importlib.metadata.distributions(path=[str(site)])
    (entry,) = [e for e in dist.entry_points if e.group == "sglang.srt.plugins"]
    assert entry.value == "prefillonly_sgl.sglang_runtime.plugin:load_plugin"
    assert entry.load().__name__ == "load_plugin"


def test_install_without_a_kit_says_how_to_build_one(tmp_path):
    result = subprocess.run(
        [sys.executable, str(KIT_SCRIPTS / "install.py"), "--kit", str(tmp_path / "none")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert "scripts/gpu_kit/build.py" in result.stderr


def test_size_check_without_a_kit_says_how_to_build_one(tmp_path):
    check = [sys.executable, str(KIT_SCRIPTS / "build.py"), "--check-only"]
    result = subprocess.run([*check, "--kit", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode == 2
    assert f"no kit at {tmp_path}" in result.stderr and "build.py" in result.stderr


@pytest.mark.slow
@pytest.mark.kit  # wheels from the registry, the card command on CPU
@pytest.mark.slow
def test_builder_trims_flashinfer_and_keeps_the_size_limit(tmp_path):
    kit = tmp_path / "gpu_kit"
    build = [sys.executable, str(KIT_SCRIPTS / "build.py"), "--kit", str(kit)]
    result = subprocess.run(build, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((kit / "manifest.json").read_text())
    sizes = manifest["sizes"]
    assert sizes["total_mib"] <= sizes["limit_mib"] == 55
    assert manifest["flashinfer_kept_mib"] < manifest["flashinfer_unpacked_mib"] / 5
    assert manifest["vendored_kept_whole"] == ["data/cccl/libcudacxx/include"]
    assert manifest["macro_includes"] == []
    assert any(w.startswith("apache_tvm_ffi-") and "cp312" in w for w in manifest["wheels"])
    with tarfile.open(kit / "flashinfer.tar.xz") as tar:
        names = set(tar.getnames())
    csrc = "flashinfer/data/csrc/"
    for needed in (
        "flashinfer/__init__.py",
        "flashinfer/prefill.py",
        "flashinfer/cascade.py",
        csrc + "batch_prefill.cu",
        csrc + "batch_prefill_ragged_kernel_inst.jinja",
        csrc + "cascade.cu",
        "flashinfer/data/include/flashinfer/attention/prefill.cuh",
    ):
        assert needed in names, needed
    assert not any(n.startswith("flashinfer/data/cutlass/") for n in names)
    assert not any(n.startswith(csrc + "fused_moe") for n in names)
    # the engine kit: SGLang (trimmed) and the wheels its CUDA path imports that the card
    # lacks; then the card's engine command on this kit, tiny and on CPU, with the kit's
    # sitecustomize.py in its interpreters (on the card: the CUDA support)
    assert any(w.startswith("pydantic_core-") and "cp312" in w for w in manifest["engine_wheels"])
    assert not any(w.startswith(("torch-", "transformers-")) for w in manifest["engine_wheels"])
    with tarfile.open(kit / "sglang.tar.xz") as tar:
        sglang_files = set(tar.getnames())
    assert "sglang/srt/entrypoints/engine.py" in sglang_files
    assert not any(n.startswith("sglang/multimodal_gen/") for n in sglang_files)
    assert not any(n.startswith("sglang/srt/rust_extensions/_server.") for n in sglang_files)
    # (ours, every part: two engines, the load parts' rates from its own burst; stock is
    # the same script with SGLang's settings; stock-mis needs FlashInfer, so on CPU it is
    # skipped with the reason; gpu_prefill.py's tiny run is tests/test_gpu_prefill_script.py's)
    env = {
        **os.environ,
        "KIT": str(kit),
        "PREFIX": str(tmp_path / "installed"),
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "PREFILLONLY_DEVICE": "cpu",
    }
    engine = [str(KIT_SCRIPTS / "run_on_card.sh"), "--engine", "--tiny", "--device", "cpu"]
    engine += ["--systems", "ours,stock-mis", "--work", str(tmp_path / "work")]
    ran = subprocess.run(["bash", *engine], env=env, capture_output=True, text=True, timeout=900)
    assert ran.returncode == 0, ran.stdout[-5000:]
    assert "installed flashinfer (trimmed)" in ran.stdout
    assert "installed sitecustomize.py (the engine kit's boot)" in ran.stdout
    results_dir = tmp_path / "out" / "gpu_engine"
    results = json.loads((results_dir / "results.json").read_text())
    assert results["errors"] == {}
    assert "FlashInfer" in results["skipped"]["stock-mis"]
    assert "device is cpu" in results["skipped"]["stock-mis"]
    for workload in ("items", "recommendation"):  # warmed before the burst, timed apart
        warmup = results["warmup"]["ours"][workload]
        assert warmup["requests"] == 5 and warmup["failed"] == 0 and warmup["seconds"] > 0
    rows = results["correctness"]["rows"]
    cases = ["cold", "prefix", "prefix hit", "packed item 1", "packed item 2", "packed item 3"]
    assert [r["case"] for r in rows] == [*cases, "longer than a batch"]  # the long one last
    assert {r["system"] for r in rows} == {"ours"}
    assert max(r["max_abs_logprob_diff"] for r in rows) < 1e-4  # float32 on CPU
    assert {r["case"]: r["cached_tokens"] for r in rows}["prefix hit"] > 0
    assert {r["forwards"] for r in rows if r["case"].startswith("packed")} == {1}
    assert results["engines"]["ours"]["prefill_only_kv_active"] is True
    assert "jct_model" in results["engines"]["ours"]
    assert (results_dir / "diagnostics.tar.gz").exists()
    # items: ours' bursts, then the grid from its capacity, twice; the figure the worse pass
    items = results["items"]
    assert items["capacity_measured_on"] == "ours" and len(items["rates"]) >= 7
    ours = items["systems"]["ours"]
    assert len(ours["bursts"]) == 2 and [p["pass"] for p in ours["passes"]] == [1, 2]
    for grid_pass in ours["passes"]:
        runs = grid_pass["rows"]
        assert [r["rate"] for r in runs] == items["rates"][: len(runs)]
        assert all(r["completed"] == r["requests"] > 0 and r["held_s"] > 0 for r in runs)
    assert ours["rate_at_p99"] == min(p["rate_at_p99"] for p in ours["passes"])
    rec = results["recommendation"]
    assert rec["capacity_measured_on"] == "ours" and len(rec["rates"]) == 2
    runs = rec["systems"]["ours"]["rows"]
    assert [r["rate"] for r in runs] == rec["rates"]
    assert all(r["completed"] == r["requests"] > 0 and r["held_s"] > 0 for r in runs)
    assert runs[-1]["cache_hit_share"] > 0
    # the profile (the engine's kernel profile, CPU ops here) and the forwards per part
    profile = results["profile"]["systems"]["ours"]
    assert profile["lines"] and profile["summary"]["stages_ms"]
    forwards = results["forwards"]["engines"]["ours"]
    assert forwards["items"]["forwards"] > 0 and not forwards["items"]["device_timing"]
    long = results["long"]["systems"]["ours"]
    assert long["forwards"] >= 1 and long["peak_above_resident_mib"] > 0
    markdown = (results_dir / "results.md").read_text()
    assert "## Recommendation" in markdown and "## A cold 1200-token prompt" in markdown
    assert "**The figure is a system's worse pass.**" in markdown
    assert "no device timing" in markdown and "## Where a forward's time goes" in markdown
    assert "- stock-mis: skipped: SGLang's multi-item scoring" in markdown
    assert "installed sitecustomize.py" in (results_dir / "log.txt").read_text()
    # the limit is enforced: the same kit against a 1 MiB limit fails
    check = [sys.executable, str(KIT_SCRIPTS / "build.py"), "--kit", str(kit), "--check-only"]
    over = subprocess.run(check + ["--limit-mib", "1"], capture_output=True, text=True)
    assert over.returncode == 1
    assert "exceed 1.0 MiB" in over.stderr
