"""Backend failures are not scores: invalid episodes stay out of mean@k, pass@k and success rate."""

from __future__ import annotations

import pytest

from whale_lab import metrics
from whale_lab.trace import EpisodeTrace, TurnRecord


def _t(task: str, reward: float, stop: str = "answered", finish: str = "stop",
       feedback: list[dict[str, str] | None] | None = None) -> EpisodeTrace:
    tr = EpisodeTrace(task_id=task, domain="math", sample=0, harness="h0", reward=reward,
                      stop_reason=stop)
    kinds = feedback or [None]
    tr.turns = [TurnRecord(prompt=[], response="", finish_reason=finish, prompt_tokens=10,
                           completion_tokens=5, feedback=fb) for fb in kinds]
    return tr


def _refused(task: str) -> EpisodeTrace:
    tr = _t(task, 0.0, stop="backend_error", finish="error")
    tr.error = "the server refused the request: HTTP 400: bad model"
    return tr


def test_invalid_episodes_are_excluded_from_the_scores() -> None:
    valid = [_t("a", 1), _t("a", 0), _t("b", 1)]
    traces = [*valid, _refused("a"), _refused("a"), _refused("b"), _refused("c")]
    # a: 1 of 2 valid samples; b: 1 of 1; c has no valid sample and is not a task that scored 0.
    assert metrics.mean_at_k(traces) == pytest.approx((0.5 + 1.0) / 2)
    assert metrics.mean_at_k(traces) == metrics.mean_at_k(valid)
    assert metrics.pass_at_k(traces) == pytest.approx(1.0)
    assert metrics.pass_at_k(traces, k=1) == metrics.pass_at_k(valid, k=1) == pytest.approx(0.75)
    assert metrics.success_rate(traces) == pytest.approx(2 / 3)


def test_only_invalid_episodes_score_nothing_rather_than_zero_of_something() -> None:
    traces = [_refused("a"), _refused("b")]
    assert metrics.valid(traces) == []
    assert metrics.mean_at_k(traces) == metrics.pass_at_k(traces) == 0.0
    assert metrics.success_rate(traces) == 0.0
    d = metrics.diagnostics(traces)
    assert (d["invalid_episodes"], d["invalid_share"]) == (2.0, 1.0)
    assert "accuracy_when_answered" not in d


def test_an_error_turn_makes_the_episode_invalid_whatever_its_stop_reason() -> None:
    tr = _t("a", 0.0, stop="turn_cap", finish="error")
    assert metrics.is_invalid(tr) and metrics.is_invalid(_refused("a"))
    assert not metrics.is_invalid(_t("a", 0.0, stop="format_failure"))


def test_diagnostics_count_invalid_episodes_and_harness_chosen_moves() -> None:
    chose = {"kind": "harness_chose_move", "detail": "fallback", "text": ""}
    illegal = {"kind": "illegal", "detail": "e9e10", "text": ""}
    traces = [
        _t("a", 1, feedback=[chose, None, illegal, chose]),
        _t("b", 0, feedback=[None]),
        _refused("c"),
    ]
    d = metrics.diagnostics(traces)
    assert d["invalid_episodes"] == 1.0
    assert d["invalid_share"] == pytest.approx(1 / 3)
    assert d["harness_chose_move"] == pytest.approx(2 / 6)  # 2 of 6 turns
    assert d["stop_backend_error"] == pytest.approx(1 / 3)
    assert metrics.FAILURE_LABELS["harness_chose_move"] == "harness chose the move (not the model)"
    assert "invalid_share" in metrics.FAILURE_LABELS
    assert metrics.diagnostics([_t("a", 1)])["invalid_episodes"] == 0.0
