"""How many engines and servers the suite starts, and from which module: the setups that
dominate its time (README's test section quotes the counts). conftest.py registers it as
a plugin.

An Engine is counted when its constructor runs in the test process (Engine objects the
tests make, fixtures included); a server when tests/server_process.py starts `prefillonly
serve`. Engines inside spawned programs (a server's own, a CLI subprocess, a Ray worker)
are not Engine objects here: a server counts once, as a server."""

from __future__ import annotations

import collections
import os

STARTS: collections.Counter = collections.Counter()  # (kind, module) -> starts


def current_module() -> str:
    test = os.environ.get("PYTEST_CURRENT_TEST", "")  # "tests/x.py::test (setup)"
    return test.split("::")[0] or "?"


def count(kind: str) -> None:
    STARTS[(kind, current_module())] += 1


def install() -> None:
    """Count every Engine constructed in this process."""
    from prefillonly_sgl import engine

    original = engine.Engine.__init__

    def counted(self, *args, **kwargs):
        count("engine")
        return original(self, *args, **kwargs)

    engine.Engine.__init__ = counted


def summary() -> list[str]:
    totals = collections.Counter()
    for (kind, _), n in STARTS.items():
        totals[kind] += n
    lines = [
        f"starts: {totals['engine']} engines, {totals['server']} servers "
        "(tests/start_counts.py; the modules starting most:)"
    ]
    by_module = collections.Counter()
    for (_, module), n in STARTS.items():
        by_module[module] += n
    for module, n in by_module.most_common(15):
        kinds = ", ".join(
            f"{STARTS[(k, module)]} {k}" for k in ("engine", "server") if STARTS[(k, module)]
        )
        lines.append(f"  {n:3d}  {module} ({kinds})")
    return lines
