"""The eval summary shows only its domain's diagnostics, each with its unit."""

from __future__ import annotations

import pytest

from whale_lab import metrics
from whale_lab.commands.eval import print_report
from whale_lab.trace import EpisodeTrace, TurnRecord


def _trace(stop: str, reward: float, tool_calls: int = 0, illegal: int = 0) -> EpisodeTrace:
    turn = TurnRecord(
        prompt=[{"role": "user", "content": "q"}],
        response="r",
        finish_reason="stop",
        prompt_tokens=10,
        completion_tokens=5,
    )
    return EpisodeTrace(
        task_id="t",
        domain="math",
        sample=0,
        harness="h0",
        turns=[turn, turn],
        reward=reward,
        stop_reason=stop,
        tool_calls=tool_calls,
        illegal_moves=illegal,
        format_failures=1,
    )


DIAG = metrics.diagnostics(
    [_trace("answered", 1.0, tool_calls=2), _trace("turn_cap", 0.0), _trace("answered", 0.0)]
)


def test_math_rows_have_units_and_no_chess_or_search_rows() -> None:
    rows = {label: (value, unit) for label, value, unit in metrics.summary_rows("math", DIAG)}
    assert rows["python calls"] == ("0.67", "per episode")
    assert rows["format failures"] == ("50.0", "% of turns")  # 3 of 6 turns
    assert rows["ended at the turn cap"] == ("33.3", "% of episodes")
    assert rows["correct when answered"] == ("50.0", "% of answered episodes")
    assert not {"illegal moves", "harness chose the move (not the model)", "searches"} & set(rows)


def test_chess_rows_name_moves_and_other_endings_follow() -> None:
    diag = dict(DIAG, stop_format_failure=0.25)
    labels = [label for label, _, _ in metrics.summary_rows("chess", diag)]
    assert "illegal moves" in labels and "python calls" not in labels
    assert labels[-1] == "ended: format_failure"
    assert "ended: answered" not in labels  # the ordinary ending is not a failure row


def test_an_unknown_domain_gets_the_common_rows() -> None:
    labels = [label for label, _, _ in metrics.summary_rows("mine", DIAG)]
    assert labels[:3] == ["turns", "reply tokens", "format failures"]
    assert "python calls" not in labels


def test_printed_summary_uses_the_domain_rows(capsys: pytest.CaptureFixture[str]) -> None:
    print_report(
        {
            "domain": "search",
            "split": "val",
            "harness": "harnesses/search/h0.py",
            "model": "micro",
            "k": 1,
            "mean_at_k": 0.3,
            "pass_at_k": 0.3,
            "n_tasks": 3,
            "rollouts": 3,
            "mean_turns": 2.0,
            "seconds": 1.0,
            "diagnostics": DIAG,
            "run_dir": "runs/x",
        }
    )
    out = capsys.readouterr().out
    assert "searches" in out and "% of turns" in out
    assert "illegal" not in out and "python" not in out


def _judged(reward: float, em: bool, verdict: str | None) -> EpisodeTrace:
    t = _trace("answered" if verdict is not None else "turn_cap", reward)
    t.info.update({"em": em, "judge": verdict})
    return t


def test_a_judged_search_eval_reports_exact_match_beside_the_judge() -> None:
    """The judge decides the reward; exact match over the same episodes and the judge's fallback
    share are shown beside it, and only where a judge scored."""
    diag = metrics.diagnostics(
        [
            _judged(1.0, em=False, verdict="correct"),  # a paraphrase the judge accepted
            _judged(1.0, em=True, verdict="correct"),
            _judged(0.0, em=False, verdict="fallback"),  # no verdict: exact match decided
            _judged(0.0, em=False, verdict=None),  # never answered
        ]
    )
    assert diag["exact_match"] == 0.25
    assert diag["judge_fallback_share"] == pytest.approx(1 / 3)
    rows = {label: (value, unit) for label, value, unit in metrics.summary_rows("search", diag)}
    assert rows["exact match (beside the judge)"] == ("25.0", "% of episodes")
    assert rows["judge gave no verdict (exact match decided)"] == ("33.3", "% of answered episodes")
    assert "exact_match" not in DIAG  # no judge, no row: exact match is the reward itself
