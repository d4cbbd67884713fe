"""SVG snapshots at 80x24 and 120x40 from recorded run folders (no engine, so deterministic).

Regenerate after an intended change with:
    pytest tests/tui/test_snapshots.py --snapshot-update -k <the tests that changed>
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from textual.worker import WorkerState

from whale_lab.config import Config, RunConfig
from whale_lab.tui import pack_render
from whale_lab.tui.app import WhaleLabApp
from whale_lab.tui.launcher import FirstRunScreen, first_run_text
from whale_lab.tui.screens import SteerScreen
from whale_lab.tui.state import SteerEntry

SIZE = (80, 24)
WIDE = (120, 40)
HERE = Path(__file__).resolve().parent
FIXTURE_RUN = HERE / "fixtures" / "run"
REVIEW_RUN = HERE / "fixtures" / "review_run"


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run folders are opened by a path relative to the temporary folder, so the header's
    run path reads the same on every machine."""
    monkeypatch.chdir(tmp_path)


def app_on(run: Path) -> WhaleLabApp:
    return WhaleLabApp(Config(), run_dir=os.path.relpath(run), replay_only=True)


def cut_run(tmp_path: Path, name: str, after: str, nth: int = 1) -> Path:
    """The recorded run cut after the `nth` event of type `after` (a run caught mid-way)."""
    dst = tmp_path / name
    shutil.copytree(FIXTURE_RUN, dst)
    lines = (FIXTURE_RUN / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if f'"type": "{after}"' in line]
    (dst / "events.jsonl").write_text("".join(lines[: hits[nth - 1] + 1]), encoding="utf-8")
    return dst


@pytest.fixture
def review_run(tmp_path: Path) -> Path:
    dst = tmp_path / "review_run"
    shutil.copytree(REVIEW_RUN, dst)
    return dst


# ---------------------------------------------------------------------- the dashboard


def test_header_and_rollouts(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), terminal_size=SIZE)


def test_accuracy(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["2"], terminal_size=SIZE)


def test_accuracy_wide(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["2"], terminal_size=WIDE)


def test_review_queue(snap_compare, interrupted_run) -> None:
    assert snap_compare(app_on(interrupted_run), press=["3"], terminal_size=SIZE)


def test_control_and_probe(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["4"], terminal_size=SIZE)


def test_header_in_a_weight_phase(snap_compare, tmp_path) -> None:
    run = cut_run(tmp_path, "weight", "weight_step", nth=2)
    assert snap_compare(app_on(run), terminal_size=WIDE)


def test_header_in_a_harness_phase(snap_compare, tmp_path) -> None:
    run = cut_run(tmp_path, "harness", "candidate_validated", nth=3)
    assert snap_compare(app_on(run), terminal_size=SIZE)


def test_replayed_finished_run(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["5"], terminal_size=WIDE)


def test_help(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["question_mark"], terminal_size=WIDE)


class _FrozenClock:
    """`time` as the app's header reads it, stopped at one instant (the rest of `time` as is)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def freeze_header_clock(monkeypatch: pytest.MonkeyPatch, run: Path) -> None:
    """With an engine running, the header counts elapsed time and rates up to the wall clock;
    stopped at the run's last event, the picture is the same at any hour."""
    import json

    from whale_lab.tui import app as app_module
    from whale_lab.tui import render

    lines = (run / "events.jsonl").read_text(encoding="utf-8").splitlines()
    clock = _FrozenClock(float(json.loads(lines[-1])["ts"]))
    monkeypatch.setattr(app_module, "time", clock)
    monkeypatch.setattr(render, "time", clock)


class _Running:
    """The engine worker as the app sees it: still running (no engine behind it)."""

    state = WorkerState.RUNNING


def engine_running(app: WhaleLabApp) -> Any:
    """A `run_before` that shows the replayed run as a live one: the engine "running" and
    every panel redrawn now as a live app draws it (state, rates, time left, under the frozen
    clock), so the once-a-second header redraw, which a slow machine reaches before the
    picture is taken, changes nothing."""

    async def attach(pilot: Any) -> None:
        app._engine_worker = _Running()  # type: ignore[assignment]
        app.flush_now()
        app._refresh_all()
        await pilot.pause()

    return attach


def _quit_confirmation(snap_compare: Any, tmp_path: Path, monkeypatch: Any, size: Any) -> bool:
    run = cut_run(tmp_path, "quit", "weight_step", nth=2)
    freeze_header_clock(monkeypatch, run)
    app = app_on(run)
    return snap_compare(app, press=["q"], terminal_size=size, run_before=engine_running(app))


def test_quit_confirmation(snap_compare, tmp_path, monkeypatch) -> None:
    assert _quit_confirmation(snap_compare, tmp_path, monkeypatch, SIZE)


def test_quit_confirmation_wide(snap_compare, tmp_path, monkeypatch) -> None:
    assert _quit_confirmation(snap_compare, tmp_path, monkeypatch, WIDE)


START_PLAN = (
    {"cycle": 1, "kind": "weight", "budget": 0.1, "unit": "epochs"},
    {"cycle": 1, "kind": "harness", "budget": 6.0, "unit": "iterations"},
    {"cycle": 2, "kind": "weight", "budget": 0.6, "unit": "epochs"},
)


def start_eval_run(tmp_path: Path) -> Path:
    """A new run 48 s into its baseline evaluation: 96 of 256 val episodes done, their rows in."""
    import json

    from whale_lab.events import ActivityProgress, EpisodeFinished, RunStarted

    t0 = 1_700_000_000.0
    events: list[Any] = [
        RunStarted(
            run_id="20240101-000000-default",
            domain="math",
            model="micro",
            schedule="whale",
            harness="harnesses/h0.py",
            plan=START_PLAN,
            harness_source="harnesses/math/h0.py",
            ts=t0,
        ),
        ActivityProgress(activity="eval", label="val", done=0, total=256, ts=t0 + 1),
    ]
    stops = ("answered", "wrong", "answered", "turn_cap")
    for i in range(96):
        events.append(
            EpisodeFinished(
                phase="eval",
                task_id=f"math-v-{i // 8:04d}",
                sample=i % 8,
                turns=1 + i % 2,
                reward=1.0 if i % 3 == 0 else 0.0,
                stop_reason=stops[i % 4] if i % 3 else "answered",
                tokens=60 + i % 40,
                harness="h0",
                trace_path="traces/eval-val.jsonl",
                trace_line=i,
                ts=t0 + 1 + i * 0.5,
            )
        )
    events.append(
        ActivityProgress(
            activity="eval", label="val", done=96, total=256, tokens=7680, seconds=48.0, ts=t0 + 49
        )
    )
    run = tmp_path / "start_eval"
    run.mkdir()
    text = "".join(json.dumps(ev.to_dict()) + "\n" for ev in events)
    (run / "events.jsonl").write_text(text, encoding="utf-8")
    return run


def test_header_in_the_start_evaluation(snap_compare, tmp_path, monkeypatch) -> None:
    """`val 96/256` with its time left and the rates, before any phase has begun."""
    run = start_eval_run(tmp_path)
    freeze_header_clock(monkeypatch, run)
    app = app_on(run)
    assert snap_compare(app, terminal_size=WIDE, run_before=engine_running(app))


# ---------------------------------------------------------------------- the review pack


def test_review_pack(snap_compare, review_run) -> None:
    """The README's screenshot."""
    assert snap_compare(app_on(review_run), press=["3"], terminal_size=WIDE)


def test_review_pack_small(snap_compare, review_run) -> None:
    assert snap_compare(app_on(review_run), press=["3"], terminal_size=SIZE)


def test_proposer_transcript(snap_compare, review_run) -> None:
    assert snap_compare(app_on(review_run), press=["3", "t"], terminal_size=WIDE)


async def _focus_pairs(pilot: Any) -> None:
    await pilot.press("3")
    await pilot.pause()
    pilot.app.screen.query_one("#review-pairs").focus()


def test_paired_traces(snap_compare, review_run) -> None:
    assert snap_compare(
        app_on(review_run), press=["down", "enter"], terminal_size=WIDE, run_before=_focus_pairs
    )


def test_paired_traces_small(snap_compare, review_run) -> None:
    assert snap_compare(
        app_on(review_run), press=["enter"], terminal_size=SIZE, run_before=_focus_pairs
    )


def _steer_note(snap_compare: Any, review_run: Path, size: Any) -> bool:
    app = app_on(review_run)
    notes = [
        SteerEntry(
            "s0a1b2c3d",
            "stop after two failed searches",
            "tui",
            status="not applicable",
            cycle=1,
            iteration=2,
            proposer="rules",
            detail="not applicable: the rules proposer does not read notes",
        ),
        SteerEntry("s4e5f6a7b", "show the passage titles", "tui"),
    ]

    async def open_steer(pilot: Any) -> None:
        await pilot.press("3")
        history = pack_render.steer_history(notes, {"s9c8d7e6f": "keep answers short"})
        app.push_screen(
            SteerScreen(
                "The LLM proposer gets it in the system message of its next session.", history
            )
        )
        await pilot.pause()

    return snap_compare(
        app, press=["t", "i", "t", "l", "e", "s"], terminal_size=size, run_before=open_steer
    )


def test_steer_note(snap_compare, review_run) -> None:
    assert _steer_note(snap_compare, review_run, WIDE)


def test_steer_note_small(snap_compare, review_run) -> None:
    assert _steer_note(snap_compare, review_run, SIZE)


# ---------------------------------------------------------------------- runs from the app


def _runs_folder(tmp_path: Path, *, unfinished: bool) -> Path:
    runs = tmp_path / "runs"
    done = runs / "20260101-000000-default"
    shutil.copytree(FIXTURE_RUN, done)
    (done / "config.json").write_text("{}", encoding="utf-8")
    if unfinished:
        cut = runs / "20260102-000000-default"
        shutil.copytree(done, cut)
        lines = (done / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
        (cut / "events.jsonl").write_text("".join(lines[:40]), encoding="utf-8")
    return runs


def _launching_app() -> WhaleLabApp:
    cfg = dataclasses.replace(Config(), run=RunConfig(directory="runs"))
    app = WhaleLabApp(cfg, engine_factory=_no_engine)
    app.offer_runs = True
    return app


def _no_engine(*args: Any) -> Any:  # the dialogs are pictured before any engine starts
    raise AssertionError("no engine may start before the question is answered")


def test_resume_or_new(snap_compare, tmp_path) -> None:
    _runs_folder(tmp_path, unfinished=True)
    assert snap_compare(_launching_app(), terminal_size=SIZE)


def test_new_run_dialog(snap_compare, tmp_path) -> None:
    _runs_folder(tmp_path, unfinished=False)
    assert snap_compare(_launching_app(), terminal_size=SIZE)


def test_first_run_panel(snap_compare, tmp_path) -> None:
    run = cut_run(tmp_path, "first", "phase_started")
    app = app_on(run)

    async def show_panel(pilot: Any) -> None:
        app.push_screen(FirstRunScreen(first_run_text(Config())))
        await pilot.pause()

    assert snap_compare(app, terminal_size=WIDE, run_before=show_panel)
