from __future__ import annotations

import pytest

from whale_lab import metrics
from whale_lab.trace import EpisodeTrace, TurnRecord


def _t(task: str, reward: float, stop: str = "answered", turns: int = 1, **kw) -> EpisodeTrace:
    tr = EpisodeTrace(task_id=task, domain="math", sample=0, harness="h0", reward=reward,
                      stop_reason=stop, **kw)
    tr.turns = [TurnRecord(prompt=[], response="", finish_reason="stop", prompt_tokens=10,
                           completion_tokens=5) for _ in range(turns)]
    return tr


def test_mean_and_pass_at_k() -> None:
    traces = [_t("a", 1), _t("a", 0), _t("a", 0), _t("a", 0), _t("b", 0), _t("b", 0), _t("b", 0), _t("b", 0)]
    assert metrics.mean_at_k(traces) == pytest.approx((0.25 + 0.0) / 2)
    assert metrics.pass_at_k(traces) == pytest.approx(0.5)
    # unbiased pass@1 from 4 samples with 1 correct is 1/4
    assert metrics.pass_at_k(traces, k=1) == pytest.approx(0.125)


def test_diagnostics_count_failure_kinds() -> None:
    traces = [_t("a", 0, "format_failure", turns=2, format_failures=2),
              _t("b", 1, "answered", turns=2, tool_calls=1, tool_errors=1),
              _t("c", 0, "turn_cap", turns=2)]
    d = metrics.diagnostics(traces)
    assert d["format_failure_rate"] == pytest.approx(2 / 6)
    assert d["tool_error_rate"] == pytest.approx(1.0)
    assert d["stop_turn_cap"] == pytest.approx(1 / 3)
    assert d["mean_turns"] == pytest.approx(2)
    assert d["accuracy_when_answered"] == pytest.approx(1.0)
