"""The app on the real engine (the embedded micro model, tiny splits): a short harness-search
run where one candidate is approved and another rejected through key presses; a quit in the middle
of the start evaluation, which must leave no score behind and run again on resume; and the new-run
dialog's answers in the config.json the engine writes."""

from __future__ import annotations

import dataclasses
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import RadioButton

from whale_lab.config import Config, RunConfig, load_config
from whale_lab.events import (
    ActivityProgress,
    EpisodeFinished,
    EvalResult,
    Event,
    ReviewDecided,
    RunFinished,
    RunStarted,
)
from whale_lab.store import read_json
from whale_lab.tui.app import WhaleLabApp, default_engine_factory
from whale_lab.tui.launcher import NewRunScreen
from whale_lab.tui.screens import ConfirmScreen, ReasonScreen, TraceScreen
from whale_lab.tui.state import load_run_events, replay

pytest.importorskip("whale_lab.engine.engine")

pytestmark = pytest.mark.slow

SETTINGS = [
    "schedule.kind=harness-only",
    "schedule.total_harness_iterations=2",
    "harness_search.candidates_per_iteration=2",
    "harness_search.smoke_tasks=2",
    "domain.splits.weight=8",
    "domain.splits.harness=4",
    "domain.splits.val=4",
    "domain.splits.test=4",
    "sampling.k=1",
    "sampling.max_new_tokens=24",
    "approval.mode=manual",
]


async def test_review_a_real_run_by_keys(tmp_path: Path, wait_for) -> None:
    cfg = load_config(None, [f"run.directory={tmp_path}", *SETTINGS])
    app = WhaleLabApp(cfg, flush_interval=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.reviewer.pending()) == 1, timeout=120)
        first = app.reviewer.pending()[0].candidate_id
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("approve", ()) is True)
        await pilot.press("a")
        await wait_for(
            pilot,
            lambda: any(i.candidate_id != first for i in app.reviewer.pending()),
            timeout=120,
        )
        second = app.reviewer.pending()[0].candidate_id
        await wait_for(pilot, lambda: app.check_action("reject", ()) is True)
        await pilot.press("r")
        assert isinstance(app.screen, ReasonScreen)
        await pilot.press(*"noisy", "enter")
        await wait_for(pilot, lambda: not app.engine_running, timeout=120)
        app.flush_now()
        assert not app.engine_error, app.engine_error
        # a trace of the live run opens from its run folder
        await pilot.press("1", "o")
        assert isinstance(app.screen, TraceScreen)
        await pilot.press("escape")
        root = app.run_root
    assert root is not None
    events = load_run_events(root)
    decided = [
        (e.candidate_id, e.decision, e.reason) for e in events if isinstance(e, ReviewDecided)
    ]
    assert decided == [(first, "approve", "approved in review"), (second, "reject", "noisy")]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"]
    cands = root / "harness_phases" / "cycle-01" / "candidates"
    assert read_json(cands / first / "decision.json")["decision"] == "approve"
    assert read_json(cands / second / "decision.json")["reason"] == "noisy"
    assert replay(events) == app.view


async def _quit(app: WhaleLabApp, pilot: Any, wait_for: Any) -> None:
    """`q`, and `y` where the app asks (it asks whenever the engine is working)."""
    await pilot.press("q")
    await pilot.pause()
    if isinstance(app.screen, ConfirmScreen):
        await pilot.press("y")
    await wait_for(pilot, lambda: not app.is_running, timeout=120)


class GateFirstEvalEpisode:
    """The real engine, held in the engine thread as its first evaluation episode is recorded,
    so the test can quit at a known point mid-evaluation (a store listener runs in that thread)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, cfg: Config, run_dir: str | None, reviewer: Any, commands: Any) -> Any:
        engine, store = default_engine_factory(cfg, run_dir, reviewer, commands)

        def hold(ev: Event) -> None:
            if isinstance(ev, EpisodeFinished) and ev.phase == "eval" and not self.reached.is_set():
                self.reached.set()
                self.release.wait(60)

        store.subscribe(hold)
        return engine, store


EVAL_SETTINGS = [
    "schedule.kind=harness-only",
    "schedule.total_harness_iterations=1",
    "harness_search.candidates_per_iteration=1",
    "harness_search.smoke_tasks=1",
    "domain.splits.weight=4",
    "domain.splits.harness=2",
    "domain.splits.val=6",
    "domain.splits.test=2",
    "sampling.k=1",
    "sampling.batch_size=1",  # waves of 4 episodes: a stop in the first cuts val at 4/6 or less
    "sampling.max_new_tokens=16",
    "approval.mode=manual",
]


async def test_quit_mid_evaluation_records_nothing_and_resume_runs_it_again(
    tmp_path: Path, wait_for
) -> None:
    cfg = load_config(None, [f"run.directory={tmp_path}", *EVAL_SETTINGS])
    gate = GateFirstEvalEpisode()
    app = WhaleLabApp(cfg, engine_factory=gate, flush_interval=0.05)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, gate.reached.is_set, timeout=120)
            await wait_for(pilot, lambda: app.view.activity.activity is not None)
            assert "val 0/6" in app._work_under_way()
            await pilot.press("q")
            assert isinstance(app.screen, ConfirmScreen)  # an evaluation would be cut: it asks
            await pilot.press("y")
            await wait_for(pilot, app.commands.stop_requested.is_set)
            gate.release.set()  # the engine goes on to its next check, which sees the stop
            await wait_for(pilot, lambda: not app.is_running, timeout=120)
    finally:
        gate.release.set()
    assert not app.engine_error and not app.engine_left_running
    root = app.run_root
    assert root is not None
    cut = load_run_events(root)
    assert [e.status for e in cut if isinstance(e, RunFinished)] == ["stopped"]
    progress = [e for e in cut if isinstance(e, ActivityProgress) and e.activity == "eval"]
    assert {e.label for e in progress} == {"val"}  # cut inside val; test never began
    ran = [e for e in cut if isinstance(e, EpisodeFinished) and e.phase == "eval"]
    assert 1 <= len(ran) < 6
    # the part that ran is not a score: no eval_result, no checkpoint, nothing marked evaluated
    assert not [e for e in cut if isinstance(e, EvalResult)]
    assert not (root / "checkpoints" / "start").exists()
    state = read_json(root / "state.json")
    assert state["checkpoints"] == {} and state["last_eval"] is None

    resumed = WhaleLabApp(cfg, run_dir=str(root), flush_interval=0.05)
    async with resumed.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(resumed.view.evals) >= 1, timeout=120)
        await _quit(resumed, pilot, wait_for)
    assert not resumed.engine_error
    events = load_run_events(root)
    second = max(i for i, e in enumerate(events) if isinstance(e, RunStarted))
    again = [e for e in events[second:] if isinstance(e, EpisodeFinished) and e.phase == "eval"]
    scored = [e for e in events if isinstance(e, EvalResult)]
    assert scored and all(e.phase == "start" and e.cycle == 0 for e in scored)
    val = next(e for e in scored if e.split == "val")
    assert val.n_tasks == 6 and val.k == 1
    # the whole of val ran again, the episodes the cut had finished included
    assert len(again) >= 6 and {e.task_id for e in ran} <= {e.task_id for e in again}
    assert (root / "checkpoints" / "start" / "checkpoint.json").is_file()


async def test_the_new_run_dialog_writes_its_answers_to_config_json(
    tmp_path: Path, wait_for
) -> None:
    runs = tmp_path / "runs"
    done = runs / "20260101-000000-done"  # only a finished run: the dialog opens at once
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "run", done)
    (done / "config.json").write_text("{}", encoding="utf-8")
    base = load_config(None, [*SETTINGS, "schedule.kind=whale", "approval.mode=manual"])
    cfg = dataclasses.replace(base, run=RunConfig(directory=str(runs)))
    app = WhaleLabApp(cfg, flush_interval=0.05)
    app.offer_runs = True
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, NewRunScreen))
        for name in ("chess", "harness-only", "auto"):
            await pilot.click(next(b for b in app.screen.query(RadioButton) if b.name == name))
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.run_root is not None, timeout=120)
        root = app.run_root
        assert root is not None and root.parent == runs
        await pilot.press("escape")  # the first-run panel
        await _quit(app, pilot, wait_for)
    saved = read_json(root / "config.json")
    assert (saved["domain"]["name"], saved["schedule"]["kind"], saved["approval"]["mode"]) == (
        "chess",
        "harness-only",
        "auto",
    )
    assert saved["domain"]["harness"] == ""  # the math harness did not follow to chess
    assert saved["domain"]["splits"]["val"] == 4  # the rest is the config the app was given
