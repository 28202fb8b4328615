"""`prefillonly demo` end to end (the README's main job), on the tiny model for speed."""

from __future__ import annotations

import pytest

from prefillonly_sgl.cli import main

pytestmark = pytest.mark.slow  # the demo end to end


def test_demo_prints_predictions_accuracy_and_throughput(tiny_llama_path, capsys):
    assert main(["demo", "--limit", "4", "--model", str(tiny_llama_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "predicted=" in line]
    assert len(lines) == 4 and all("truth=" in line and "p(positive)=" in line for line in lines)
    assert "[demo] accuracy" in out and "items/s" in out
