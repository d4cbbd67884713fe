"""Busy areas are redrawn at most once per interval, and nothing that changed is dropped."""

from __future__ import annotations

from whale_lab.config import Config
from whale_lab.tui.app import PACE, PACED, WhaleLabApp


def test_a_busy_table_is_redrawn_once_a_second_and_never_lost() -> None:
    app = WhaleLabApp(Config())
    assert PACE == 1.0 and {"rollouts", "status"} <= set(PACED)
    assert app._pace({"rollouts", "control"}, 100.0) == {"rollouts", "control"}
    # episodes keep arriving: held back, remembered
    assert app._pace({"rollouts", "control"}, 100.3) == {"control"}
    assert app._pace({"status"}, 100.6) == set()
    # the interval is up: drawn together, with all that arrived meanwhile, though nothing new came
    assert app._pace(set(), 101.05) == {"rollouts", "status"}
    assert app._pace(set(), 102.5) == set()


def test_flush_now_draws_what_pacing_held_back() -> None:
    app = WhaleLabApp(Config())
    app._pace({"accuracy"}, 10.0)
    app._pace({"accuracy"}, 10.2)
    assert "accuracy" in app._paced
    drawn: list[set[str]] = []
    app._refresh = lambda changed, rebuild=False: drawn.append(set(changed))  # type: ignore[method-assign]
    app.flush_now()
    assert any("accuracy" in d for d in drawn) and not app._paced
