"""Installs the GPU kit on a lent machine (stdlib only; no pip, no network needed).

    python3 scripts/gpu_kit/install.py --kit build/gpu_kit --into /tmp/gpukit

Unpacks the trimmed flashinfer into INTO/site, and each wheel of the kit whose modules the
machine cannot already import (a wheel is a zip of its package: unpacking it beside the
others installs it for PYTHONPATH=INTO/site). When PATH has no `ninja` (flashinfer's JIT
runs it), the ninja wheel's program is written to INTO/bin. Prints what it did.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path


def top_level_modules(wheel: zipfile.ZipFile) -> set[str]:
    """The importable names a wheel installs, from its file list: its top-level folders,
    .py modules and extension modules (.dist-info / .data excluded)."""
    names = set()
    for name in wheel.namelist():
        first = name.split("/")[0]
        if first.endswith((".dist-info", ".data")):
            continue
        if "/" in name:
            names.add(first)
        elif name.endswith(".py"):
            names.add(first[:-3])
        elif name.endswith(".so"):
            names.add(first.split(".")[0])
    return names


def install(kit: Path, into: Path) -> list[str]:
    site, bin_dir = into / "site", into / "bin"
    site.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    done = []
    with tarfile.open(kit / "flashinfer.tar.xz") as tar:
        tar.extractall(site, filter="data")
    done.append("flashinfer (trimmed)")
    for path in sorted((kit / "wheels").glob("*.whl")):
        with zipfile.ZipFile(path) as wheel:
            modules = top_level_modules(wheel)
            if path.name.startswith("ninja-"):
                if shutil.which("ninja"):
                    continue
                member = next(n for n in wheel.namelist() if n.endswith(".data/scripts/ninja"))
                program = bin_dir / "ninja"
                program.write_bytes(wheel.read(member))
                program.chmod(0o755)
                done.append(path.name + " (the ninja program)")
                continue
            if modules and all(importlib.util.find_spec(m) is not None for m in modules):
                continue
            wheel.extractall(site)
            done.append(path.name)
    return done


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
