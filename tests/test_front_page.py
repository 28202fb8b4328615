"""The front page (issue 78): README.md stays short, its code blocks run as written, no
measured figure it once held was lost in the move to docs/, and the docs read as a set
(docs/README.md lists each; every relative link resolves).

Each fenced block of README.md with a language is marked on the line before it:
`<!-- readme-test: engine -->` (run here, in this process, as written: it starts its own
Engine on the embedded default model), `<!-- readme-test: server -->` (run against
`prefillonly serve` on the default model, the session's server: a `curl` line with its
port, a Python block with its URL) or `<!-- readme-test: skip (why) -->`. A block without
a marker fails."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_LINES = 200
README_URL = "http://localhost:30000"
MARKER = re.compile(r"<!-- readme-test: (engine|server|skip)\b[^>]*-->")

# Every measured figure README.md held before the move (2026-11-28, 578 lines), frozen: each
# must still be on the front page or in a doc. "a|b": the figure as the doc writes it (a
# range the README gave is a table's two cells there). The README's "~18 min" suite time
# is not here: it was stale, superseded by the measured times in docs/testing.md.
FIGURES = [
    "0.06 s", "0.071x", "0.1 s", "0.42 s", "0.5 s", "0.65x", "0.7 GB", "0.8-1.1 requests/s",
    "1,017 tokens", "1,024-token", "1,193 MiB", "1.03-1.09x", "1.1 s", "1.1%", "1.2 s",
    "1.26x", "1.3 GiB", "1.30x", "1.5 GiB", "1.84x", "1.9x", "10 min 04 s", "10.2 s",
    "100-token", "11.6 s", "13 min 28 s", "14 min 29 s", "15 GB", "15 s", "16,384 tokens",
    "17 min 07 s", "19-38%", "2 min 47 s", "2-5x", "2.1-2.4x", "2.2 requests/s",
    "2.28 requests/s", "2.2x", "2.7x", "2.8x", "20.2 s", "2048-token", "22 s", "29x",
    "3.16 requests/s", "3.2x", "3.3 GB", "3.5x", "3.8x", "3.94 items/s", "32x", "35 s",
    "37 MiB", "41.4 s", "47 min 37 s", "5.4x", "6.1x", "6.8x", "758 items/s", "81 MiB",
    "82.5%", "85 s", "9.0 s", "90.0%", "92%", "1,621 tests", "63 Engine objects",
    "659 requests", "17.2 vs lpm's 3.16", "495 -> 81 MiB", "325 vs 1,193 MiB",
    "1.7 vs 11.6 s", "637", "897-994", "32,768", "0.83",
    "1.10-1.13x|2-token labels 1.13x", "81-85%|| round_robin | 70% | 81% | 85% |",
]  # fmt: skip


def _corpus() -> str:
    paths = [README, REPO / "ARCHITECTURE.md", REPO / "benchmarks" / "README.md",
             REPO / "examples" / "README.md", *sorted(DOCS.glob("*.md"))]  # fmt: skip
    return "\n".join(p.read_text() for p in paths)


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """(language, code, marker kind) of each fenced block with a language."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        fence = re.match(r"^```(\w+)\s*$", lines[i])
        if fence:
            j = lines.index("```", i + 1)
            before = next((x for x in reversed(lines[:i]) if x.strip()), "")
            marker = MARKER.search(before)
            out.append((fence.group(1), "\n".join(lines[i + 1 : j]), marker and marker.group(1)))
            i = j
        elif lines[i].startswith("```"):  # an output block: skip to its end
            i = lines.index("```", i + 1)
        i += 1
    return out


def test_readme_is_a_front_page():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_no_measured_figure_was_lost():
    corpus = _corpus()
    missing = [f for f in FIGURES if not any(alt in corpus for alt in f.split("|") if alt)]
    assert not missing, f"figures README once held, now nowhere: {missing}"


def test_docs_index_lists_every_doc():
    index = (DOCS / "README.md").read_text()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    docs = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert docs <= linked, f"docs/README.md does not list {sorted(docs - linked)}"


def test_relative_links_resolve():
    broken = []
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if not (page.parent / path).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_every_readme_block_is_marked():
    found = blocks(README.read_text())
    assert found and all(kind for _, _, kind in found), [code[:60] for _, code, k in found if not k]


def _run_python(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_block"})
    return out.getvalue()


def test_engine_blocks_run_as_written():
    engine_blocks = [code for lang, code, kind in blocks(README.read_text()) if kind == "engine"]
    assert len(engine_blocks) >= 2
    for code in engine_blocks:
        printed = _run_python(code)
        assert printed.strip(), code[:80]  # each block prints what it computed


def test_server_blocks_run_against_the_server(default_server):
    port = default_server.url.rsplit(":", 1)[1]
    server_blocks = [
        (lang, code) for lang, code, kind in blocks(README.read_text()) if kind == "server"
    ]
    assert any(lang == "bash" for lang, _ in server_blocks)
    for lang, code in server_blocks:
        if lang == "python":
            assert README_URL in code
            assert _run_python(code.replace(README_URL, default_server.url)).strip()
            continue
        serve = next(line for line in code.splitlines() if " serve " in line)
        # the session's server is `prefillonly serve` on the default model, no flags
        assert shlex.split(serve.split("#")[0])[2:] == ["--port", "30000"]
        command = "\n".join(x for x in code.splitlines() if x != serve)
        done = subprocess.run(
            ["bash", "-c", "set -e -o pipefail\n" + command.replace(":30000", f":{port}")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0 and done.stdout.strip(), done.stderr
        assert '"error"' not in done.stdout and '"detail"' not in done.stdout, done.stdout
