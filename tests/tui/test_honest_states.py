"""The app says what is true: a command is pending until the engine says it acted, quitting asks
whenever work would be cut, and a run another process holds opens read-only.

Pilot tests drive the real app over a recorded event stream (`ReplayEngine` acknowledges a
command with `CommandReceived` and says it took effect with `CommandApplied`, as the engine's
safe points do); the reducer tests feed the events by hand so the in-between states can be seen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from whale_lab.config import Config
from whale_lab.events import (
    ActivityProgress,
    CommandApplied,
    CommandReceived,
    PhaseEnded,
    PhaseStarted,
    RunStarted,
)
from whale_lab.tui.app import WhaleLabApp
from whale_lab.tui.control import ControlInputs
from whale_lab.tui.screens import ConfirmScreen
from whale_lab.tui.state import RunView

SIZE = (100, 32)


def make_app(**kwargs: object) -> WhaleLabApp:
    kwargs.setdefault("flush_interval", 0.05)
    return WhaleLabApp(Config(), **kwargs)  # type: ignore[arg-type]


def toasts(app: WhaleLabApp) -> list[str]:
    return [n.message for n in app._notifications]


def inputs(view: RunView, **sent: bool) -> ControlInputs:
    return ControlInputs(
        engine_running=True,
        exiting=False,
        stop_requested=False,
        view_stopping=view.stopping,
        view_paused=view.paused,
        pause_sent=sent.get("pause_sent", False),
        pause_applied=view.activity.paused,
        switch_sent=sent.get("switch_sent", False),
        phase_active=view.phase_active,
        phase=view.phase,
        probe_running=False,
        probe_sent=False,
        can_resume_run=False,
    )


def started_view() -> RunView:
    view = RunView()
    view.apply(RunStarted(run_id="r", domain="math", model="micro", schedule="whale", harness="h"))
    view.apply(PhaseStarted(cycle=1, phase="weight", budget=1.0, budget_unit="epochs"))
    return view


# ---------------------------------------------------------------------- the reducer


def test_a_pause_is_pending_until_the_engine_says_it_paused() -> None:
    view = started_view()
    assert inputs(view, pause_sent=True).pausing  # sent, not yet received
    view.apply(CommandReceived(command="pause", by="tui"))
    assert inputs(view).pausing  # received, the engine has not reached a safe point yet
    view.apply(CommandApplied(command="pause", detail="paused at a safe point"))
    c = inputs(view)
    assert c.paused and not c.pausing
    view.apply(CommandReceived(command="resume", by="tui"))
    view.apply(CommandApplied(command="resume", detail="resumed"))
    assert not inputs(view).paused


def test_a_switch_sent_is_not_offered_twice() -> None:
    view = started_view()
    from whale_lab.tui.control import applicable_controls

    assert "switch" in applicable_controls(inputs(view))
    assert "switch" not in applicable_controls(inputs(view, switch_sent=True))


# ---------------------------------------------------------------------- the app


async def test_pause_shows_pausing_then_paused_with_a_toast_at_each_end(
    make_engines, wait_for
) -> None:
    engines = make_engines(hold_after=5)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.phase_active)
        await pilot.press("p")
        # the badge says paused only once the engine has said so
        assert app.display_state() == ("paused" if app.view.activity.paused else "pausing")
        assert any("Pause requested" in m for m in toasts(app))
        await wait_for(pilot, lambda: app.display_state() == "paused")
        await wait_for(pilot, lambda: any("Paused at a safe point" in m for m in toasts(app)))
        await pilot.press("g")
        await wait_for(pilot, lambda: app.display_state() == "running")
        await wait_for(pilot, lambda: "Resumed." in toasts(app))
        engines.engine.release.set()


async def test_switch_is_requested_until_the_engine_acts(make_engines, wait_for) -> None:
    engines = make_engines(hold_after=5)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.phase_active)
        app.action_switch()  # what "s" runs; checked before the UI can flush the answer
        assert app._switch_sent and app._status_note() == "switch requested"
        assert app.check_action("switch", ()) is None  # not sent twice
        await wait_for(pilot, lambda: not app._switch_sent)
        assert any("Switch requested" in m for m in toasts(app))
        await wait_for(pilot, lambda: any(m.startswith("Switched:") for m in toasts(app)))
        assert app._status_note() == ""
        engines.engine.release.set()


async def test_quit_asks_during_an_evaluation_between_phases(make_engines, wait_for) -> None:
    engines = make_engines(hold_after=4, hold_outside_phase=True)
    engines.events = [
        RunStarted(run_id="r", domain="math", model="micro", schedule="whale", harness="h0"),
        PhaseStarted(cycle=1, phase="weight", budget=1.0, budget_unit="epochs"),
        PhaseEnded(cycle=1, phase="weight", reason="budget"),
        ActivityProgress(activity="eval", label="val", done=96, total=256),
    ]
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.activity.activity is not None)
        assert not app.view.phase_active
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        assert "val 96/256" in app._work_under_way()
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running)
    assert not app.engine_left_running


async def test_a_run_held_by_another_process_opens_read_only(
    make_engines, wait_for, interrupted_run: Path
) -> None:
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (interrupted_run / "engine.lock").write_text(json.dumps({"pid": holder.pid, "since": 0}))
        engines = make_engines()
        app = make_app(engine_factory=engines, run_dir=str(interrupted_run))
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await pilot.pause()
            assert app.read_only_pid == holder.pid
            assert not engines.engines  # no second engine on the folder
            assert app.display_state() == "read-only"
            assert f"process {holder.pid}" in app._control_state_text().plain
            assert app.check_action("resume", ()) is None
            # the holder keeps writing: the read-only app follows
            before = app.view.event_count
            with open(interrupted_run / "events.jsonl", "a", encoding="utf-8") as fh:
                ev = ActivityProgress(activity="eval", label="val", done=3, total=8)
                fh.write(json.dumps(ev.to_dict()) + "\n")
            await wait_for(pilot, lambda: app.view.event_count == before + 1)
            assert app.view.activity.activity is not None
            holder.kill()
            holder.wait(5)
            await wait_for(pilot, lambda: app.read_only_pid is None)
            # `notify` posts a message: the toast lands on the next turn of the app's loop
            await wait_for(pilot, lambda: any("closed this run" in m for m in toasts(app)))
            assert app.check_action("resume", ()) is True
    finally:
        if holder.poll() is None:
            holder.kill()
