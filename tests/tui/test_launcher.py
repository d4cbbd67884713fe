"""Runs from the app: resume the latest unfinished run or start new, the new-run dialog, and the
first-run panel."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Label, RadioButton

from whale_lab.config import Config, RunConfig
from whale_lab.events import ActivityProgress
from whale_lab.tui.app import WhaleLabApp
from whale_lab.tui.launcher import (
    FirstRunScreen,
    NewRun,
    NewRunScreen,
    StartScreen,
    find_runs,
    first_run_text,
    latest_unfinished,
)

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run"
SIZE = (100, 32)


def _runs(tmp_path: Path, *, unfinished: bool = True) -> Path:
    """runs/ with the recorded (finished) run and, optionally, a copy cut before its end."""
    runs = tmp_path / "runs"
    done = runs / "20260101-000000-done"
    shutil.copytree(FIXTURE_RUN, done)
    (done / "config.json").write_text("{}", encoding="utf-8")
    if unfinished:
        cut = runs / "20260102-000000-cut"
        shutil.copytree(done, cut)
        lines = (done / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
        (cut / "events.jsonl").write_text("".join(lines[:40]), encoding="utf-8")
    (runs / "not-a-run").mkdir()
    return runs


class Recorder:
    """An engine factory that records the config and folder it was asked to open."""

    def __init__(self, engines: Any) -> None:
        self.engines = engines
        self.calls: list[tuple[Config, str | None]] = []

    def __call__(self, cfg: Config, run_dir: str | None, reviewer: Any, commands: Any) -> Any:
        self.calls.append((cfg, run_dir))
        return self.engines(cfg, run_dir, reviewer, commands)


def _app(runs: Path, factory: Any) -> WhaleLabApp:
    cfg = dataclasses.replace(Config(), run=RunConfig(directory=str(runs)))
    app = WhaleLabApp(cfg, engine_factory=factory, flush_interval=0.05)
    app.offer_runs = True
    return app


def test_find_runs_tells_finished_from_unfinished(tmp_path: Path) -> None:
    runs = find_runs(_runs(tmp_path))
    by_name = {r.path.name: r for r in runs}
    assert set(by_name) == {"20260101-000000-done", "20260102-000000-cut"}
    assert by_name["20260101-000000-done"].status == "completed"
    assert by_name["20260102-000000-cut"].resumable
    latest = latest_unfinished(runs)
    assert latest is not None and latest.path.name == "20260102-000000-cut"
    assert find_runs(tmp_path / "nowhere") == []


def test_new_run_choice_becomes_the_config() -> None:
    cfg = dataclasses.replace(
        Config(), domain=dataclasses.replace(Config().domain, harness="harnesses/math/x.py")
    )
    new = NewRun("search", "harness-only", "auto").apply(cfg)
    assert (new.domain.name, new.schedule.kind, new.approval.mode) == (
        "search",
        "harness-only",
        "auto",
    )
    assert new.domain.harness == ""  # the math harness does not follow to search
    same = NewRun("math", "whale", "manual").apply(cfg)
    assert same.domain.harness == "harnesses/math/x.py"


def test_first_run_text_says_what_runs_waits_and_skips() -> None:
    text = first_run_text(Config()).plain
    assert "baseline evaluation" in text and "weight 0.6 ep, harness 6 it" in text
    assert "Review tab (3)" in text and "approval.mode = manual" in text
    assert "s ends the current phase" in text
    auto = dataclasses.replace(
        Config(), approval=dataclasses.replace(Config().approval, mode="auto")
    )
    assert "nothing: candidates are decided by approval.mode = auto" in first_run_text(auto).plain


async def test_resume_the_latest_unfinished_run(tmp_path: Path, make_engines, wait_for) -> None:
    runs = _runs(tmp_path)
    factory = Recorder(make_engines())
    app = _app(runs, factory)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, StartScreen)
        assert not factory.calls  # nothing starts before the answer
        await pilot.press("r")
        await wait_for(pilot, lambda: bool(factory.calls))
        assert factory.calls[0][1] == str(runs / "20260102-000000-cut")
        assert app.view.event_count >= 40  # its history is on screen


async def test_start_new_from_the_dialog(tmp_path: Path, make_engines, wait_for) -> None:
    runs = _runs(tmp_path)
    factory = Recorder(make_engines())
    app = _app(runs, factory)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("n")
        assert isinstance(app.screen, NewRunScreen)
        for name in ("search", "harness-only", "auto"):
            button = next(b for b in app.screen.query(RadioButton) if b.name == name)
            button.value = True
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(factory.calls))
        cfg, run_dir = factory.calls[0]
        assert run_dir is None  # a new folder, made by the engine from this config
        assert (cfg.domain.name, cfg.schedule.kind, cfg.approval.mode) == (
            "search",
            "harness-only",
            "auto",
        )
        assert isinstance(app.screen, FirstRunScreen)
        assert "approval.mode = auto" in str(app.screen.text)
        await pilot.press("escape")
        assert not isinstance(app.screen, FirstRunScreen)


async def test_escape_from_the_dialog_goes_back_then_quit(tmp_path: Path, make_engines) -> None:
    factory = Recorder(make_engines())
    app = _app(_runs(tmp_path), factory)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("n")
        await pilot.press("escape")
        assert isinstance(app.screen, StartScreen)
        await pilot.press("q")
        await pilot.pause()
    assert not factory.calls


async def test_a_fresh_clone_starts_at_once_with_the_panel(
    tmp_path: Path, make_engines, wait_for
) -> None:
    factory = Recorder(make_engines())
    app = _app(tmp_path / "runs", factory)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(factory.calls))
        assert isinstance(app.screen, FirstRunScreen)
        await pilot.press("enter")
        assert not isinstance(app.screen, FirstRunScreen)


async def test_without_offer_runs_nothing_is_asked(tmp_path: Path, make_engines, wait_for) -> None:
    runs = _runs(tmp_path)
    factory = Recorder(make_engines())
    app = _app(runs, factory)
    app.offer_runs = False  # a test or `whale-lab tui --run`: no question
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(factory.calls))
        assert not isinstance(app.screen, (StartScreen, FirstRunScreen))


HOLD_LOCK = """
import sys
from pathlib import Path
from whale_lab.engine import runlock

runlock.acquire(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.read()  # until the test closes stdin
runlock.release(Path(sys.argv[1]))
"""


@pytest.fixture
def held_run(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """runs/ whose unfinished run another process has open: it took the engine's own lock."""
    runs = _runs(tmp_path)
    cut = runs / "20260102-000000-cut"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(cut)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        yield cut, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_find_runs_names_the_process_holding_a_run(held_run) -> None:
    cut, proc = held_run
    runs = find_runs(cut.parent)
    latest = latest_unfinished(runs)
    assert latest is not None and latest.path == cut and latest.holder == proc.pid
    assert all(r.holder is None for r in runs if r.path != cut)


async def test_resuming_a_held_run_follows_it_read_only(held_run, make_engines, wait_for) -> None:
    cut, proc = held_run
    factory = Recorder(make_engines())
    app = _app(cut.parent, factory)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        assert isinstance(app.screen, StartScreen)
        said = " ".join(str(label.render()) for label in app.screen.query(Label))
        assert f"open in process {proc.pid}" in said and "read-only" in said
        await pilot.press("r")
        await wait_for(pilot, lambda: app.read_only_pid == proc.pid)
        assert not factory.calls  # no second engine on the folder, so nothing can fail
        assert app.display_state() == "read-only" and not app.engine_error
        assert app.run_root == cut and app.view.event_count >= 40
        assert f"process {proc.pid}" in app._control_state_text().plain
        assert app.check_action("resume", ()) is None
        # the holder writes on: the app follows its events
        before = app.view.event_count
        with open(cut / "events.jsonl", "a", encoding="utf-8") as fh:
            ev = ActivityProgress(activity="eval", label="val", done=3, total=8)
            fh.write(json.dumps(ev.to_dict()) + "\n")
        await wait_for(pilot, lambda: app.view.event_count == before + 1)
        # the holder lets go: resume (g) continues the run here, with an engine of its own
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)
        await wait_for(pilot, lambda: app.read_only_pid is None)
        assert app.check_action("resume", ()) is True
        await pilot.press("g")
        await wait_for(pilot, lambda: bool(factory.calls))
        assert factory.calls[0][1] == str(cut)
        assert app.display_state() != "failed"
