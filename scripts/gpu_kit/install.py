"""Installs the GPU kit on a lent machine (stdlib only; no pip, no network needed).

    python3 scripts/gpu_kit/install.py --kit build/gpu_kit --into /tmp/gpukit

Unpacks the trimmed flashinfer into INTO/site, and each wheel of the kit whose modules the
machine cannot already import (a wheel is a zip of its package: unpacking it beside the
others installs it for PYTHONPATH=INTO/site). When PATH has no `ninja` (flashinfer's JIT
runs it), the ninja wheel's program is written to INTO/bin. The engine's part (a kit built
with it: sglang.tar.xz, engine-wheels/) goes into the same folder, SGLang only where no
SGLang imports, and INTO/site/sitecustomize.py runs the engine kit's boot
(prefillonly_sgl/sglang_runtime/cuda_kit_support, and cpu_support too where
PREFILLONLY_DEVICE=cpu: the dress rehearsal) in every interpreter started with INTO/site
on PYTHONPATH, SGLang's spawned workers included. Where no installed distribution
declares the project's SGLang plugin (the tree travels as files, without its egg-info), a
dist-info folder in INTO/site declares it, from pyproject.toml's entry points: SGLang loads
its plugins by entry point, so without it every SGLang process runs stock. Prints what it
did.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import tomllib


def top_level_modules(wheel: zipfile.ZipFile) -> set[str]:
    """The importable names a wheel installs, from its file list: its top-level folders,
    .py modules and extension modules (.dist-info / .data excluded)."""
    names = set()
    for name in wheel.namelist():
        first = name.split("/")[0]
        if first.endswith((".dist-info", ".data", ".libs")):  # .libs: vendored shared libraries
            continue
        if "/" in name:
            names.add(first)
        elif name.endswith(".py"):
            names.add(first[:-3])
        elif name.endswith(".so"):
            names.add(first.split(".")[0])
    return names


REPO = Path(__file__).resolve().parents[2]
# Written into INTO/site: Python imports `sitecustomize` from sys.path at start-up.
SITECUSTOMIZE = """\
# Written by scripts/gpu_kit/install.py: the engine kit's boot in every interpreter that
# has this folder on PYTHONPATH (SGLang's spawned scheduler and detokenizer too).
# PREFILLONLY_DEVICE=cpu (the dress rehearsal of the card's software on a CPU) adds the
# CPU support.
import os as _os
import runpy as _runpy

_supports = ["cuda_kit_support"]
if _os.environ.get("PREFILLONLY_DEVICE") == "cpu":
    _supports.append("cpu_support")
for _support in _supports:
    _boot = _os.path.join({repo!r}, "prefillonly_sgl", "sglang_runtime", _support, "boot.py")
    _runpy.run_path(_boot)
"""


def install_engine(kit: Path, site: Path) -> list[str]:
    """The engine kit's part, where the kit has it (see the module docstring)."""
    if not (kit / "sglang.tar.xz").is_file():
        return []
    done = []
    if not importable("sglang"):
        with tarfile.open(kit / "sglang.tar.xz") as tar:
            tar.extractall(site, filter="data")
        done.append("sglang (trimmed)")
    done += unpack_missing(sorted((kit / "engine-wheels").glob("*.whl")), site)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE.format(repo=str(REPO)))
    done.append("sitecustomize.py (the engine kit's boot)")
    return done + declare_plugin(site)


PLUGIN_GROUP = "sglang.srt.plugins"


def declare_plugin(site: Path, pyproject: Path = REPO / "pyproject.toml") -> list[str]:
    """The project's SGLang plugin declared in SITE (a dist-info folder with its entry
    points, as pip would write), unless an installed distribution declares it already."""
    project = tomllib.loads(pyproject.read_text())["project"]
    plugins = project["entry-points"][PLUGIN_GROUP]
    declared = {e.name for e in importlib.metadata.entry_points(group=PLUGIN_GROUP)}
    if set(plugins) <= declared:
        return []
    name = project["name"].replace("-", "_")
    folder = site / f"{name}-{project['version']}.dist-info"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n"
    )
    lines = [f"[{PLUGIN_GROUP}]"] + [f"{key} = {value}" for key, value in plugins.items()]
    (folder / "entry_points.txt").write_text("\n".join(lines) + "\n")
    return [f"{folder.name} (declares the SGLang plugin {', '.join(sorted(plugins))})"]


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def unpack_missing(wheels: list[Path], site: Path) -> list[str]:
    """Unpacks each wheel whose modules this interpreter cannot import."""
    done = []
    for path in wheels:
        with zipfile.ZipFile(path) as wheel:
            modules = top_level_modules(wheel)
            if modules and all(importable(m) for m in modules):
                continue
            wheel.extractall(site)
            done.append(path.name)
    return done


def install(kit: Path, into: Path) -> list[str]:
    site, bin_dir = into / "site", into / "bin"
    site.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    done = []
    with tarfile.open(kit / "flashinfer.tar.xz") as tar:
        tar.extractall(site, filter="data")
    done.append("flashinfer (trimmed)")
    wheels = sorted((kit / "wheels").glob("*.whl"))
    for path in [w for w in wheels if w.name.startswith("ninja-")]:
        if shutil.which("ninja"):
            continue
        with zipfile.ZipFile(path) as wheel:
            member = next(n for n in wheel.namelist() if n.endswith(".data/scripts/ninja"))
            program = bin_dir / "ninja"
            program.write_bytes(wheel.read(member))
        program.chmod(0o755)
        done.append(path.name + " (the ninja program)")
    done += unpack_missing([w for w in wheels if not w.name.startswith("ninja-")], site)
    return done + install_engine(kit, site)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=Path("build/gpu_kit"))
    parser.add_argument("--into", type=Path, default=Path("/tmp/gpukit"))
    args = parser.parse_args()
    if not (args.kit / "flashinfer.tar.xz").is_file():
        print(
            f"no kit at {args.kit}: build it with scripts/gpu_kit/build.py and carry it",
            file=sys.stderr,
        )
        return 2
    for line in install(args.kit, args.into):
        print("installed", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
