"""The package's shape, read from its source (no imports run): no import cycle inside
prefillonly_sgl (module-level and function-level imports alike), between modules or
between subpackages, the Engine independent of the server, no unittest.mock in
production code, the package root holding its public face and folders only, one module
per file name (beyond the role names that parallel folders share) and a docstring in
every folder's __init__ (ARCHITECTURE.md's folder map)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "prefillonly_sgl"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Modules of the package that `name` imports (a package's __init__ is its face: an
    import of `pkg.mod` counts as `pkg.mod`, not as `pkg`)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return {m for m in found if m in modules and m != name}


def _graph(packages: bool = False) -> dict[str, set[str]]:
    """Each module -> the package's modules it imports (an import of a package's face not
    counted: its __init__ imports its own modules). packages=True: each subpackage of
    prefillonly_sgl one node (its modules, subpackages and face), each top-level module
    its own."""
    modules = _modules()
    if packages:
        graph: dict[str, set[str]] = {}
        for m, p in modules.items():
            node = _package_of(m)
            graph.setdefault(node, set()).update(_package_of(t) for t in _imports(m, p, modules))
        return {node: targets - {node} for node, targets in graph.items()}
    faces = {m for m, p in modules.items() if p.name == "__init__.py"}
    return {m: _imports(m, p, modules) - faces for m, p in modules.items()}


def _package_of(module: str) -> str:
    """prefillonly_sgl.<first part>: a top-level module, or the subpackage holding it; each
    feature folder (prefillonly_sgl.features.<name>) is a package of its own, beside the
    registry (prefillonly_sgl.features itself)."""
    parts = module.split(".")
    if parts[:2] == ["prefillonly_sgl", "features"] and len(parts) > 2:
        return ".".join(parts[:3])
    return ".".join(parts[:2])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_inside_the_package():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_no_import_cycle_between_subpackages():
    """At the package level too: no subpackage imports one that imports it back (through
    any chain), whatever modules the imports are in."""
    cycle = _cycle(_graph(packages=True))
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_engine_imports_nothing_from_the_server():
    server = sorted(m for m in _graph()["prefillonly_sgl.engine"] if ".server" in m)
    assert server == []


def test_no_unittest_mock_in_production_code():
    users = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "unittest" in path.read_text() and "mock" in path.read_text()
    ]
    assert users == []


def _imports_sglang(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            if (node.module or "").split(".")[0] == "sglang":
                return True
        elif isinstance(node, ast.Import):
            if any(alias.name.split(".")[0] == "sglang" for alias in node.names):
                return True
    return False


def _may_import_sglang(relative: Path) -> bool:
    """The runtime's boot code and fronts (sglang_runtime/), the hook mechanism (hooking/),
    a feature's process modules (named for their process: *_process.py, scheduler_*.py),
    the command line (serve --help lists SGLang's own flags), and the tiny decision
    checkpoints' builder (a Clef head's weights are written from SGLang's own head class:
    its parameter names are the published format)."""
    parts = relative.parts
    if parts[0] in ("sglang_runtime", "hooking") or relative == Path("cli.py"):
        return True
    if relative == Path("models/tiny_decision_checkpoints.py"):
        return True
    name = relative.name
    return parts[0] == "features" and (
        name.endswith("_process.py") or name.startswith("scheduler_")
    )


def test_sglang_is_imported_only_by_process_modules_and_the_runtime():
    """Plain decisions stay testable without SGLang: every other module imports none of
    it, at module or function level."""
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if _imports_sglang(path) and not _may_import_sglang(path.relative_to(PACKAGE))
    ]
    assert offenders == []
    assert _may_import_sglang(Path("features/prefill_kv/scheduler_process.py"))
    assert not _may_import_sglang(Path("features/prefill_kv/policy.py"))
    assert _imports_sglang(PACKAGE / "features/prefill_kv/scheduler_process.py")


def _environ_uses(path: Path) -> tuple[bool, bool]:
    """(reads the environment, writes it): os.environ / os.getenv, by what is done."""
    reads = writes = False
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("getenv", "putenv", "unsetenv"):
            reads |= node.attr == "getenv"
            writes |= node.attr != "getenv"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if isinstance(target, ast.Attribute) and target.attr == "environ":
                if node.func.attr in ("get", "copy", "items", "keys", "values"):
                    reads = True
                else:
                    writes = True
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
            if node.value.attr == "environ":
                writes |= isinstance(node.ctx, ast.Store | ast.Del)
                reads |= isinstance(node.ctx, ast.Load)
    return reads, writes


def test_the_environment_is_read_in_one_module_and_written_only_at_the_edges():
    """machine/environment.py reads it; only what hands values to other programs writes it: the
    runtime configuration for SGLang's spawned workers (plugin.runtime_enabled), SGLang's
    CPU switch (cpu_support/boot.py), the engine kit's SGLang switches
    (cuda_kit_support/boot.py), and a forked worker's copy of its caller's environment, as
    a spawned one would inherit it (worker_forkserver.py). No setting goes from one of our
    modules to another through it."""
    readers, writers = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        reads, writes = _environ_uses(path)
        name = str(path.relative_to(PACKAGE))
        readers += [name] if reads else []
        writers += [name] if writes else []
    assert readers == ["machine/environment.py", "sglang_runtime/plugin.py"]  # plugin: to restore
    assert writers == [
        "sglang_runtime/cpu_support/boot.py",
        "sglang_runtime/cuda_kit_support/boot.py",
        "sglang_runtime/plugin.py",
        "sglang_runtime/worker_forkserver.py",
    ]


PUBLIC_FACE = {"__init__.py", "__main__.py", "cli.py", "engine.py"}
# File names that parallel folders share by role (ARCHITECTURE.md's folder map).
ROLE_NAMES = {
    "__init__.py",
    "scheduler_process.py",
    "tokenizer_process.py",
    "settings.py",
    "plan.py",
    "policy.py",
    "boot.py",
    "cli.py",
}


def test_the_package_root_holds_the_public_face_and_folders_only():
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in PUBLIC_FACE)
    assert loose == []


def test_one_module_per_file_name_beyond_the_role_names():
    """A reader who greps a file name lands in one room."""
    by_name: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    repeated = {n: sorted(p) for n, p in by_name.items() if len(p) > 1 and n not in ROLE_NAMES}
    assert repeated == {}


def test_every_folder_says_what_lives_there():
    silent = [
        str(init.relative_to(PACKAGE))
        for init in PACKAGE.rglob("__init__.py")
        if len((ast.get_docstring(ast.parse(init.read_text())) or "").split()) < 8
    ]
    assert silent == []
