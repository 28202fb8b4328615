"""Builds the GPU kit: what a lent GPU machine lacks to run benchmarks/gpu_prefill.py.

    .venv/bin/python scripts/gpu_kit/build.py                  # -> build/gpu_kit/ (git-ignored)
    .venv/bin/python scripts/gpu_kit/build.py --check-only     # sizes of an existing kit
    .venv/bin/python scripts/gpu_kit/build.py --compile-check  # + compile the kit's kernels

The lent machines have Python 3.12, torch (CUDA), triton, transformers, nvcc and ninja, and
no network; one command there receives the working tree plus what `carry` names, 64 MiB
in all. The kit is:

    wheels/                  cp312 wheels flashinfer needs that such a machine may lack
                             (apache-tvm-ffi, its JIT's binding layer; nvidia-ml-py,
                             requests, ... pure Python); install.py unpacks only the missing
    flashinfer.tar.xz        flashinfer-python trimmed to what its FA2 batch prefill
                             (ragged and paged) and merge_state kernels compile from
    manifest.json            versions, what was kept and why, the sizes

Trimming is read from flashinfer itself (probe_specs.py): the JIT specs the project's
FlashInfer query chunks build, the files flashinfer opens to render them, the compiler's
include directories from its own flag builder, then every header those sources can reach
(include_closure.py). flashinfer's own headers are kept file by file; a vendored library
reached at all (CCCL's libcudacxx, ...) is kept whole, because its headers include each
other under configuration macros a text walk cannot evaluate, and a partial copy would
compile against the toolkit's copy of the rest. The Python package keeps the modules
`import flashinfer` loads and their sibling modules (imported lazily by the wrappers).
The wheel's 420 MB unpacked become a few MB.

The total (kit + the git tree that travels with it) must stay under --limit-mib (55):
the build fails otherwise. --compile-check then installs the kit into a temporary folder
and compiles its kernels there with this machine's nvcc for sm_90a (no GPU needed; a stub
libcuda.so stands in for the driver at link time): a file the trim left out fails the
build here rather than on the card.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engine_part import build_engine_part  # noqa: E402
from include_closure import include_closure  # noqa: E402

REPO = HERE.parents[1]
KIT = REPO / "build" / "gpu_kit"
TARGET_PYTHON = "3.12"
FLASHINFER = "flashinfer-python==0.7.2.post1"
TVM_FFI = "apache-tvm-ffi==0.1.15.post2"  # flashinfer 0.7.2 needs >=0.1.11,<0.2
# Pure-Python modules `import flashinfer` loads that a machine with torch and
# transformers may lack (probed: pynvml, requests and its four). ninja: flashinfer's JIT
# calls the `ninja` program; the wheel carries one in case PATH has none.
EXTRA_WHEELS = (
    "nvidia-ml-py",
    "requests",
    "urllib3",
    "idna",
    "certifi",
    "charset-normalizer",
    "einops",
    "tabulate",
    "ninja",
)
# The card's glibc takes any of these (the device tool's notes); pip picks the best match.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (34, 28, 27, 26, 24, 17, 5)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "any",
)
LIMIT_MIB = 55
OWN_DATA_DIRS = ("include", "csrc")  # flashinfer's own headers: kept file by file


def pip_download(
    requirements, dest: Path, python_version: str | None = TARGET_PYTHON, platforms=PLATFORMS
) -> None:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    if python_version:
        command += ["--python-version", python_version, "--implementation", "cp"]
        for platform in platforms:
            command += ["--platform", platform]
    command += ["-q", "-d", str(dest), *requirements]
    subprocess.run(command, check=True)


def unzip(wheel: Path, into: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(into)


# What the probes import that this machine's environment may lack, built for the Python
# running them (not the kit's 3.12): tvm-ffi and pynvml (flashinfer), cuda-python
# (flashinfer.comm, imported by SGLang's CUDA path; the card has it).
LOCAL_PROBE_PACKAGES = (TVM_FFI, "nvidia-ml-py", "cuda-bindings", "cuda-pathfinder")


def local_packages(work: Path) -> Path:
    """LOCAL_PROBE_PACKAGES, unpacked for PYTHONPATH."""
    local = work / "local"
    if not local.exists():
        pip_download(list(LOCAL_PROBE_PACKAGES), work / "local-wheels", python_version=None)
        for wheel in (work / "local-wheels").glob("*.whl"):
            unzip(wheel, local)
    return local


def probe(package_root: Path, work: Path, build: bool = False, env: dict | None = None) -> dict:
    """Runs probe_specs.py with this machine's Python against an unpacked flashinfer."""
    out = work / "probe.json"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(package_root), str(local_packages(work))]),
        FLASHINFER_WORKSPACE_BASE=str(work / "workspace"),
        PYTHONDONTWRITEBYTECODE="1",
        **(env or {}),
    )
    command = [sys.executable, str(HERE / "probe_specs.py"), str(out)]
    subprocess.run(command + (["--build"] if build else []), check=True, env=env)
    return json.loads(out.read_text())


def probe_engine(package_root: Path, work: Path) -> dict:
    """Runs probe_engine_imports.py with this machine's Python (which has SGLang and the
    project: the CPU install) against the unpacked flashinfer."""
    out = work / "engine-probe.json"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(package_root), str(local_packages(work))]),
        PYTHONDONTWRITEBYTECODE="1",
    )
    command = [sys.executable, str(HERE / "probe_engine_imports.py"), str(out)]
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def find_cuda_home(nvcc: Path) -> str:
    """The toolkit whose lib64 holds libcudart (flashinfer links -lcudart from
    CUDA_HOME/lib64): $CUDA_HOME, the folder above nvcc's bin (through a wrapper script
    that execs the real one), or /usr/local/cuda."""
    candidates = [os.environ.get("CUDA_HOME"), str(Path(os.path.realpath(nvcc)).parents[1])]
    text = nvcc.read_bytes()[:4096].decode(errors="replace")
    if text.startswith("#!"):
        candidates += [str(Path(w).parents[1]) for w in text.split() if w.endswith("/nvcc")]
    candidates.append("/usr/local/cuda")
    for home in filter(None, candidates):
        if list(Path(home).glob("lib*/libcudart.so*")):
            return home
    raise SystemExit(f"no CUDA toolkit with libcudart found for {nvcc}; set CUDA_HOME")


def compile_check(kit: Path) -> dict:
    """Compiles the kit's kernels from the kit alone (see the module docstring)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise SystemExit("--compile-check needs nvcc on PATH")
    cuda_home = find_cuda_home(Path(nvcc))
    with tempfile.TemporaryDirectory(prefix="gpu-kit-check-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, str(HERE / "install.py"), "--kit", str(kit), "--into", str(work)],
            check=True,
        )
        stubs = work / "stubs"  # links as the driver library; the card has the real one
        stubs.mkdir()
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-Wl,-soname,libcuda.so.1",
                "-o",
                str(stubs / "libcuda.so"),
                "-x",
                "c",
                "/dev/null",
            ],
            check=True,
        )
        env = {
            "CUDA_HOME": cuda_home,
            "FLASHINFER_EXTRA_LDFLAGS": f"-L{stubs}",
            "MAX_JOBS": str(os.cpu_count() or 2),
        }
        probed = probe(work / "site", work, build=True, env=env)
    for name, built in probed["built"].items():
        print(f"compiled {name} in {built['seconds']} s")
    return probed["built"]


def kept_files(probed: dict, engine_modules=()) -> tuple[set[Path], dict]:
    """The unpacked wheel's files the kit keeps (see the module docstring), and why.
    engine_modules: FlashInfer's module files SGLang's CUDA path loads (probe_engine)."""
    package = Path(probed["package_dir"])
    data = package / "data"
    include_dirs = [Path(d) for d in probed["include_dirs"] if not d.startswith("$")]
    sources = [Path(s) for spec in probed["specs"] for s in spec["sources"]]
    opened = [Path(p) for p in probed["opened"]]
    closure = include_closure(
        sources + [p for p in opened if p.suffix in (".cu", ".cuh")], include_dirs
    )
    keep: set[Path] = set()
    # Python: the loaded modules' folders, every .py in them
    for folder in {Path(m).parent for m in [*probed["modules"], *engine_modules]}:
        keep.update(folder.glob("*.py"))
    keep.update(
        p for p in opened if p.is_relative_to(package) and p.is_file() and p.suffix != ".pyc"
    )
    vendored = []
    for path in closure.files:
        if not path.is_relative_to(data):
            continue  # generated sources (rebuilt there) and tvm-ffi's headers (its wheel)
        top = path.relative_to(data).parts[0]
        if top in OWN_DATA_DIRS:
            keep.add(path)
            continue
        root = next(d for d in include_dirs if path.is_relative_to(d))
        if root not in vendored:
            vendored.append(root)
    for root in vendored:
        keep.update(p for p in root.rglob("*") if p.is_file())
    why = {
        "specs": [spec["name"] for spec in probed["specs"]],
        "headers_reached": len(closure.files),
        "vendored_kept_whole": [str(r.relative_to(package)) for r in vendored],
        "macro_includes": sorted(f"{f}: {m}" for f, m in closure.macro_includes),
        "toolkit_or_system_headers": len(closure.unresolved),
    }
    return keep, why


def write_archive(unpacked: Path, keep: set[Path], archive: Path) -> int:
    dist_info = next(unpacked.glob("flashinfer_python-*.dist-info"))
    files = sorted(keep) + sorted(p for p in dist_info.rglob("*") if p.is_file())
    # preset 1: 1 s for 4.8 MB here, against 12 s for 3.9 MB at 6 (the kit has room)
    with tarfile.open(archive, "w:xz", preset=1) as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(unpacked)), recursive=False)
    return len(files)


def tree_bytes() -> int:
    """What travels with the kit: the tracked and the not-ignored untracked files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    return sum(
        (REPO / os.fsdecode(p)).stat().st_size
        for p in listed
        if p and (REPO / os.fsdecode(p)).is_file()
    )


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def report_sizes(kit: Path, limit_mib: float) -> dict:
    mib = 1 << 20
    sizes = {"kit_mib": folder_bytes(kit) / mib, "tree_mib": tree_bytes() / mib}
    sizes["total_mib"] = sizes["kit_mib"] + sizes["tree_mib"]
    sizes["limit_mib"] = limit_mib
    print(
        f"kit {sizes['kit_mib']:.1f} MiB + tree {sizes['tree_mib']:.1f} MiB = "
        f"{sizes['total_mib']:.1f} MiB (limit {limit_mib} MiB)"
    )
    return sizes


def build(kit: Path, limit_mib: float) -> dict:
    if kit.exists():
        shutil.rmtree(kit)
    (kit / "wheels").mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="gpu-kit-") as tmp:
        work = Path(tmp)
        pip_download([FLASHINFER], work / "flashinfer-wheel")
        unpacked = work / "flashinfer"
        unzip(next((work / "flashinfer-wheel").glob("*.whl")), unpacked)
        probed = probe(unpacked, work)
        engine = probe_engine(unpacked, work)
        keep, why = kept_files(probed, engine["flashinfer_files"])
        count = write_archive(unpacked, keep, kit / "flashinfer.tar.xz")
        unpacked_mib = folder_bytes(unpacked) / (1 << 20)
        kept_mib = sum(p.stat().st_size for p in keep) / (1 << 20)
        engine_manifest = build_engine_part(kit, work, engine["distributions"], pip_download)
    pip_download([TVM_FFI, *EXTRA_WHEELS], kit / "wheels")
    manifest = {
        "target_python": TARGET_PYTHON,
        "flashinfer": probed["flashinfer_version"],
        "flashinfer_unpacked_mib": round(unpacked_mib, 1),
        "flashinfer_files_kept": count,
        "flashinfer_kept_mib": round(kept_mib, 1),
        **why,
        "wheels": sorted(p.name for p in (kit / "wheels").glob("*.whl")),
        **engine_manifest,
    }
    # written twice: the sizes count the manifest itself, then it records them
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    manifest["sizes"] = report_sizes(kit, limit_mib)
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, default=KIT)
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB)
    parser.add_argument("--check-only", action="store_true", help="report an existing kit's size")
    parser.add_argument(
        "--compile-check", action="store_true", help="compile the kit's kernels here (nvcc)"
    )
    args = parser.parse_args()
    if args.check_only and not (args.kit / "flashinfer.tar.xz").is_file():
        print(f"no kit at {args.kit}: build it first (scripts/gpu_kit/build.py)", file=sys.stderr)
        return 2
    if args.check_only:
        sizes = report_sizes(args.kit, args.limit_mib)
    else:
        manifest = build(args.kit, args.limit_mib)
        sizes = manifest["sizes"]
        print(
            f"flashinfer {manifest['flashinfer']}: {manifest['flashinfer_files_kept']} files "
            f"kept of {manifest['flashinfer_unpacked_mib']} MiB unpacked; vendored kept whole: "
            f"{', '.join(manifest['vendored_kept_whole']) or 'none'}"
        )
    if sizes["total_mib"] > args.limit_mib:
        print(f"the kit and the tree exceed {args.limit_mib} MiB", file=sys.stderr)
        return 1
    if args.compile_check:
        compile_check(args.kit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
