"""The Accuracy tab's plots read the right series from a recorded run."""

from __future__ import annotations

from pathlib import Path

import plotext

from whale_lab.tui.plots import (
    candidate_points,
    draw_accuracy,
    draw_candidates,
    draw_training,
    phase_spans,
)
from whale_lab.tui.state import RunView, load_run_events, replay

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run"


def recorded_events() -> list:
    return load_run_events(FIXTURE_RUN)


def test_phase_spans_follow_the_rollouts_of_each_phase() -> None:
    view = replay(recorded_events())
    spans = phase_spans(view)
    assert [s[0] for s in spans] == ["W1", "H1", "W2"]
    assert spans[0][1] == 0.0
    assert all(lo <= hi for _, lo, hi in spans)
    assert [s[1] for s in spans[1:]] == [s[2] for s in spans[:-1]]  # back to back


def test_candidate_points_mark_the_accepted_one() -> None:
    view = replay(recorded_events())
    pts = candidate_points(view)
    assert pts, "the recorded run scores candidates"
    accepted = [p for p in pts if p[3]]
    assert [p[1] for p in accepted] == ["1.2"]
    assert accepted[0][2] == 100 * view.cycles[1].accepted_score


def test_the_plots_draw_on_an_empty_run_and_say_so() -> None:
    view = RunView()
    for draw in (draw_accuracy, draw_candidates, draw_training):
        plotext.clear_figure()
        plotext.plotsize(60, 12)
        draw(plotext, view)
        assert plotext.build()  # draws without data, with a title or label saying why
    plotext.clear_figure()
