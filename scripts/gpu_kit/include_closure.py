"""The headers a set of C++ / CUDA sources can include, found as the preprocessor would
find them (plain Python, no compiler).

Every `#include "x"` / `#include <x>` line is followed, whatever `#if` surrounds it (more
files than one configuration needs, never fewer): a quoted name is looked up beside the
including file first, then in the include directories in the compiler's order; the first
hit is the file. Names found nowhere (the CUDA toolkit's and the C++ library's headers,
which the machine has) are returned apart, and so are includes of a macro
(`#include SOME_HEADER`), which cannot be followed without preprocessing: a kit built
from such a closure must keep them out or say so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.MULTILINE)
_MACRO_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]+([A-Za-z_]\w*)", re.MULTILINE)


@dataclass
class Closure:
    files: set[Path] = field(default_factory=set)  # every source and header reached
    unresolved: set[str] = field(default_factory=set)  # names no directory holds
    macro_includes: set[tuple[str, str]] = field(default_factory=set)  # (file, macro)


def include_closure(sources: list[Path], include_dirs: list[Path]) -> Closure:
    closure = Closure()
    todo = [Path(s).resolve() for s in sources]
    while todo:
        path = todo.pop()
        if path in closure.files:
            continue
        closure.files.add(path)
        text = path.read_text(errors="replace")
        for macro in _MACRO_INCLUDE.findall(text):
            closure.macro_includes.add((str(path), macro))
        for quote, name in _INCLUDE.findall(text):
            found = _find(name.strip(), path.parent if quote == '"' else None, include_dirs)
            if found is None:
                closure.unresolved.add(name.strip())
            else:
                todo.append(found)
    return closure


def _find(name: str, beside: Path | None, include_dirs: list[Path]) -> Path | None:
    for directory in ([beside] if beside is not None else []) + list(include_dirs):
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate.resolve()
    return None
