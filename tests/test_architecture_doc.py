"""ARCHITECTURE.md names only files that exist: every path in it (in a `code` span or the
folder map's code block: a .py / .md / .sh / .toml file or a folder/, `*` a wildcard) is a
file or folder of the repository, given from the repository root, from prefillonly_sgl/,
or as the tail of one path (`policy.py` inside the paragraph on its feature folder)."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATH_LIKE = re.compile(r"^[\w./*-]+(\.(py|md|sh|toml|txt|jsonl?)|/)$")


def _tracked() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True)
    files = set(out.stdout.split())
    folders = {str(Path(f).parent) + "/" for f in files}
    for folder in list(folders):  # every ancestor folder too
        parts = folder.rstrip("/").split("/")
        folders |= {"/".join(parts[:i]) + "/" for i in range(1, len(parts))}
    return files | folders


def named_paths(text: str) -> list[str]:
    prose, block_lines, in_block = [], [], False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block:
            block_lines.append(line)
        else:
            prose.append(line)
    spans = re.findall(r"`([^`\n]+)`", "\n".join(prose)) + block_lines
    paths = []
    for span in spans:
        for token in re.split(r"[\s,()]+", span):
            token = token.strip(".:;")
            if token.endswith("/.") or token.startswith(("http://", "https://", "-")):
                continue
            if PATH_LIKE.match(token) and not token.startswith("."):
                paths.append(token)
    return paths


def exists(path: str, tracked: set[str]) -> bool:
    if "*" in path:
        return any(fnmatch.fnmatch(t, f"*{path}") for t in tracked)
    for base in ("", "prefillonly_sgl/"):
        if base + path in tracked:
            return True
    return any(t.endswith("/" + path) for t in tracked)


def test_every_path_architecture_md_names_exists():
    tracked = _tracked()
    named = named_paths((REPO / "ARCHITECTURE.md").read_text())
    assert len(named) > 50
    missing = sorted({p for p in named if not exists(p, tracked)})
    assert missing == []


def test_the_path_finder_reads_code_spans():
    assert named_paths("see `dsl/job.py` and `features/prefill_kv/` (`x = 1`)") == [
        "dsl/job.py",
        "features/prefill_kv/",
    ]
    assert named_paths("```python\nx = 1\n```\ntext\n```\n  engine.py, cli.py  entry\n```") == [
        "engine.py",
        "cli.py",
    ]
    assert not exists("no_such_module.py", {"prefillonly_sgl/engine.py"})
