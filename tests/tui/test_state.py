"""The view model: a pure reducer from events, shared by live runs and replays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale_lab.events import (
    CommandReceived,
    EpisodeFinished,
    Log,
    PhaseStarted,
    ReviewDecided,
    ReviewRequested,
    RunFinished,
    RunStarted,
    event_from_dict,
)
from whale_lab.store import read_jsonl
from whale_lab.tui import render
from whale_lab.tui.state import (
    EpisodeRow,
    RunFolderError,
    RunView,
    load_run_events,
    load_trace,
    matches_filter,
    outcome,
    replay,
)

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run"


def test_fixture_round_trips_through_the_event_dataclasses() -> None:
    """Every recorded line is a current event; catches drift between events.py and the fixture."""
    records = list(read_jsonl(FIXTURE_RUN / "events.jsonl"))
    assert len(records) == 100
    for rec in records:
        ev = event_from_dict(rec)
        assert ev is not None, rec["type"]
        assert json.loads(json.dumps(ev.to_dict())) == rec


def test_replay_of_the_recorded_run() -> None:
    view = replay(load_run_events(FIXTURE_RUN))
    assert (view.run_id, view.domain, view.model, view.schedule) == (
        "20240101-000000-fixture",
        "math",
        "micro",
        "whale",
    )
    assert view.state == "completed" and not view.phase_active
    assert (view.weight_rollouts, view.harness_rollouts, view.other_rollouts) == (40, 12, 4)
    assert view.episode_count == 56 == sum(view.stop_counts.values())
    assert view.harness == "c1-i2-a" and view.base_harness == "h0"
    assert view.proposer_prompt_tokens == 12_400 and view.proposer_completion_tokens == 1_850
    assert [(p.split, p.mean_at_k) for p in view.evals] == [
        ("val", 0.31),
        ("val", 0.44),
        ("test", 0.41),
        ("val", 0.52),
        ("test", 0.49),
    ]
    c1, c2 = view.cycles[1], view.cycles[2]
    assert (c1.weight_done, c1.harness_done, c1.accepted, c1.val, c1.test) == (
        0.6,
        2,
        "c1-i2-a",
        0.44,
        0.41,
    )
    assert (c1.weight_rollouts, c1.harness_rollouts, c2.weight_rollouts) == (24, 12, 16)
    assert [s.train_reward for s in view.weight_steps] == [0.55, 0.65]  # current phase only
    assert {cid: r.status for cid, r in view.reviews.items()} == {
        "c1-i2-a": "approve",
        "c1-i2-b": "reject",
    }
    assert view.reviews["c1-i2-b"].reason.startswith("retries hide")
    assert view.candidates["c1-i2-c"].valid is False
    assert view.probes[0].recommendation.startswith("weights")
    assert view.elapsed() == pytest.approx(148.5)


def test_elapsed_sums_sessions_and_skips_downtime() -> None:
    v = RunView()
    start = dict(run_id="r", domain="math", model="m", schedule="whale", harness="h0")
    v.apply(RunStarted(ts=100.0, **start))
    v.apply(Log(ts=130.0, level="info", message="x"))
    # crash: no RunFinished; the next session starts an hour later
    v.apply(RunStarted(ts=3730.0, resumed=True, **start))
    v.apply(Log(ts=3740.0, level="info", message="y"))
    assert v.elapsed() == pytest.approx(40.0)
    assert v.elapsed(now=3750.0) == pytest.approx(50.0)
    v.apply(RunFinished(ts=3745.0, status="stopped"))
    assert v.elapsed(now=99999.0) == pytest.approx(45.0)
    assert v.resumed and v.state == "stopped"


def test_commands_and_reviews_drive_state() -> None:
    v = RunView()
    v.apply(RunStarted(run_id="r", domain="math", model="m", schedule="whale", harness="h0"))
    v.apply(PhaseStarted(cycle=1, phase="harness", budget=6, budget_unit="iterations"))
    assert v.phase_active and v.state == "running"
    assert v.apply(CommandReceived(command="pause")) >= {"control", "status"}
    assert v.state == "paused"
    v.apply(CommandReceived(command="resume"))
    assert v.state == "running"
    v.apply(ReviewRequested(candidate_id="c", diff="-a\n+b\n", hypothesis="h", surface="parser"))
    assert [r.candidate_id for r in v.pending_reviews] == ["c"]
    v.apply(ReviewDecided(candidate_id="c", decision="reject", reason="no"))
    assert v.pending_reviews == [] and v.reviews["c"].reason == "no"
    v.apply(CommandReceived(command="stop"))
    assert v.state == "stopping"


def test_outcomes_and_filters() -> None:
    def row(reward: float, stop: str) -> EpisodeRow:
        return EpisodeRow(0, 1, "weight", "t", 0, 1, reward, stop, 0, "h0", "", -1)

    assert outcome(1.0, "answered") == "success"
    assert outcome(0.0, "answered") == "wrong"
    assert outcome(0.0, "wrong_move") == "wrong"
    assert outcome(0.0, "turn_cap") == "failure"
    assert outcome(0.0, "harness_error") == "error"
    ok, bad = row(1.0, "answered"), row(0.0, "format_failure")
    assert matches_filter(ok, "all") and matches_filter(bad, "all")
    assert not matches_filter(ok, "failures") and matches_filter(bad, "failures")
    assert matches_filter(bad, "stop:format_failure") and not matches_filter(ok, "stop:turn_cap")


def test_episode_burst_is_capped_in_memory() -> None:
    from whale_lab.tui.state import MAX_EPISODES

    v = RunView()
    for i in range(MAX_EPISODES + 10):
        v.apply(
            EpisodeFinished(
                phase="weight",
                task_id=str(i),
                sample=0,
                turns=1,
                reward=0.0,
                stop_reason="turn_cap",
            )
        )
    assert len(v.episodes) == MAX_EPISODES and v.episode_count == MAX_EPISODES + 10
    assert v.episodes[0].index == 10


def test_run_folder_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(RunFolderError, match="run folder not found"):
        load_run_events(tmp_path / "missing")
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunFolderError, match="not a folder"):
        load_run_events(tmp_path / "file")
    with pytest.raises(RunFolderError, match=r"not a run folder \(no events.jsonl\)"):
        load_run_events(tmp_path)


def test_torn_last_line_and_unknown_events_are_skipped(tmp_path: Path) -> None:
    lines = (FIXTURE_RUN / "events.jsonl").read_text().splitlines(keepends=True)
    body = "".join(lines[:10]) + '{"type": "from_the_future", "x": 1}\n' + lines[10][:25]
    (tmp_path / "events.jsonl").write_text(body)
    assert len(load_run_events(tmp_path)) == 10


def test_load_trace_and_its_errors(tmp_path: Path) -> None:
    view = replay(load_run_events(FIXTURE_RUN))
    row = view.episodes[0]
    trace = load_trace(FIXTURE_RUN, row)
    assert trace.task_id == row.task_id and trace.n_turns == row.turns
    with pytest.raises(RunFolderError, match="trace file not found"):
        load_trace(tmp_path, row)
    gone = EpisodeRow(**{**row.__dict__, "trace_line": 999})
    with pytest.raises(RunFolderError, match="no line 999"):
        load_trace(FIXTURE_RUN, gone)
    none = EpisodeRow(**{**row.__dict__, "trace_path": ""})
    with pytest.raises(RunFolderError, match="has no trace recorded"):
        load_trace(FIXTURE_RUN, none)
    # an absolute path works too
    absolute = EpisodeRow(**{**row.__dict__, "trace_path": str(FIXTURE_RUN / row.trace_path)})
    assert load_trace(None, absolute).task_id == row.task_id


def test_trace_text_keeps_model_text_literal() -> None:
    view = replay(load_run_events(FIXTURE_RUN))
    failed = next(r for r in view.episodes if r.turns == 2)
    text = render.trace_text(load_trace(FIXTURE_RUN, failed))
    assert "[bold]not markup[/bold]" in text.plain
    assert "[red]maybe[/red]" in text.plain
    assert "(2 earlier messages)" in text.plain  # turn 2 shows only what is new
    assert "feedback (format)" in text.plain


def test_the_header_shows_the_last_weight_sync_state() -> None:
    from whale_lab.events import WeightStep
    from whale_lab.tui.render import status_line
    from whale_lab.tui.state import RunView

    view = RunView()
    step = dict(cycle=1, epoch=0.1, train_reward=0.5, accept_rate=0.5, kept=2, loss=1.0,
                tokens=10, grad_norm=1.0, step_seconds=1.0, rollouts=4)
    view.apply(WeightStep(step=1, **step))
    assert "weights" not in status_line(view, state="running", fallback={}).plain
    view.apply(WeightStep(step=2, sync="verified", sync_distance=0.001, **step))
    assert "weights verified" in status_line(view, state="running", fallback={}).plain
    view.apply(WeightStep(step=3, sync="unverified", **step))
    assert view.weight_sync == "unverified"
    assert "weights unverified" in status_line(view, state="running", fallback={}).plain


def test_the_review_shows_the_noise_floor_and_the_proposer_session() -> None:
    from whale_lab.events import ReviewRequested
    from whale_lab.tui.render import review_meta
    from whale_lab.tui.state import RunView

    view = RunView()
    view.apply(ReviewRequested(candidate_id="c004", diff="", hypothesis="h", surface="parser",
                               noise_floor="on 16 tasks x 1 rollouts a paired difference below "
                               "31.2 points cannot be told from noise",
                               transcript="harness_phases/cycle-01/candidates/c004/"
                               "proposer_transcript.json"))
    text = review_meta(view.reviews["c004"], live=True).plain
    assert "noise floor on 16 tasks" in text and "31.2 points" in text
    assert "proposer session harness_phases/cycle-01/candidates/c004/" in text
