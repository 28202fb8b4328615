"""ScoreResult: typed fields, and SGLang's list-of-rows behaviour (no engine needed)."""

from __future__ import annotations

import pytest

from prefillonly_sgl import ScoreResult


def test_fields_and_the_list_it_reads_as():
    result = ScoreResult(scores=[[0.25, 0.75], [0.5, 0.5]], prompt_tokens=12, cached_tokens=4)
    assert (result.prompt_tokens, result.cached_tokens) == (12, 4)
    assert len(result) == 2 and result[0] == [0.25, 0.75] and result[-1] == [0.5, 0.5]
    assert list(result) == result.scores and [p for p, _ in result] == [0.25, 0.5]
    assert result == [[0.25, 0.75], [0.5, 0.5]] and result != [[0.25, 0.75]]
    assert result[:1] == [[0.25, 0.75]] and [0.5, 0.5] in result
    assert result == ScoreResult([[0.25, 0.75], [0.5, 0.5]], 12, 4)
    assert result != ScoreResult([[0.25, 0.75], [0.5, 0.5]], 12, 0)
    with pytest.raises(TypeError):
        hash(result)
