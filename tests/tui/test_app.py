"""Pilot tests driving the real app; a recorded event stream stands in for the engine."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from whale_lab.config import Config
from whale_lab.events import ReviewDecided, RunFinished
from whale_lab.tui.app import WhaleLabApp, run_tui
from whale_lab.tui.commands import WhaleCommands
from whale_lab.tui.screens import ConfirmScreen, HelpScreen, ReasonScreen, TraceScreen
from whale_lab.tui.state import load_run_events, outcome, replay
from whale_lab.tui.widgets import RolloutsPanel

SIZE = (100, 32)


def make_app(**kwargs: object) -> WhaleLabApp:
    kwargs.setdefault("flush_interval", 0.05)
    return WhaleLabApp(Config(), **kwargs)  # type: ignore[arg-type]


def events_of(root: Path, cls: type) -> list:
    return [e for e in load_run_events(root) if isinstance(e, cls)]


# ---------------------------------------------------------------------- review


async def test_approve_and_reject_by_keys_reach_the_engine(make_engines, wait_for) -> None:
    engines = make_engines()
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("approve", ()) is True)
        await pilot.press("a")
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-b"))
        await wait_for(pilot, lambda: app.check_action("reject", ()) is True)
        await pilot.press("r")
        assert isinstance(app.screen, ReasonScreen)
        await pilot.press("enter")  # an empty reason is refused
        assert isinstance(app.screen, ReasonScreen)
        for ch in "too broad":
            await pilot.press("space" if ch == " " else ch)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.view.finished == "completed")
        engine = engines.engine
        assert [(cid, d.decision) for cid, d in engine.decisions] == [
            ("c1-i2-a", "approve"),
            ("c1-i2-b", "reject"),
        ]
        assert engine.decisions[1][1].reason == "too broad"
        root = app.run_root
        assert root is not None
        decided = events_of(root, ReviewDecided)
        assert [(d.candidate_id, d.decision, d.reason) for d in decided] == [
            ("c1-i2-a", "approve", "approved in review"),
            ("c1-i2-b", "reject", "too broad"),
        ]
        # nothing left to decide: the review keys are disabled, not hidden
        assert app.check_action("approve", ()) is None


async def test_edit_in_editor_then_approve(make_engines, wait_for, tmp_path, monkeypatch) -> None:
    script = tmp_path / "editor.py"
    script.write_text("import sys\np = sys.argv[1]\nopen(p, 'a').write('MAX_TURNS = 3\\n')\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.delenv("VISUAL", raising=False)
    engines = make_engines()
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("edit", ()) is True)
        await pilot.press("e")
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-b"))
        await pilot.press("P")  # pin the second one
        await wait_for(pilot, lambda: app.view.finished == "completed")
        (cid, edit), (cid2, pin) = engines.engine.decisions
        assert (cid, edit.decision) == ("c1-i2-a", "edit")
        assert edit.edited_code is not None and edit.edited_code.endswith("MAX_TURNS = 3\n")
        assert "SYSTEM_PROMPT" in edit.edited_code
        assert (cid2, pin.decision) == ("c1-i2-b", "pin")


async def test_edit_without_changes_decides_nothing(
    make_engines, wait_for, tmp_path, monkeypatch
) -> None:
    script = tmp_path / "noop.py"
    script.write_text("pass\n")
    monkeypatch.setenv("EDITOR", f"{sys.executable} {script}")
    monkeypatch.delenv("VISUAL", raising=False)
    engines = make_engines()
    app = make_app(engine_factory=engines, stop_timeout=5)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("edit", ()) is True)
        await pilot.press("e")
        await pilot.pause(0.1)
        assert app.reviewer.is_waiting("c1-i2-a")
        assert engines.engine.decisions == []


async def test_review_keys_follow_the_tab_and_the_queue(fixture_run) -> None:
    app = make_app(run_dir=str(fixture_run), replay_only=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        # on another tab the review keys are hidden; on the review tab, disabled (no engine waits)
        assert app.check_action("approve", ()) is False
        await pilot.press("a")
        await pilot.pause()
        assert [n.message for n in app._notifications] == [
            "Approve works on the Review tab (press 3)."
        ]
        await pilot.press("3")
        await pilot.pause()
        assert app.check_action("approve", ()) is None
        assert app.check_action("reject", ()) is None
        await pilot.press("a", "r")
        await pilot.pause()
        assert not isinstance(app.screen, ReasonScreen)
        # a disabled key says why instead of doing nothing
        await pilot.press("x")
        await pilot.pause()
        messages = [n.message for n in app._notifications]
        assert "Approve does not apply now (no candidate is waiting for a decision)." in messages
        assert "Stop does not apply now (no engine is running)." in messages
        assert [e.status for e in app.review_entries()] == ["reject", "approve"]


async def test_command_palette_offers_only_applicable_actions(make_engines, wait_for) -> None:
    engines = make_engines()
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("3")
        await pilot.pause()
        provider = WhaleCommands(app.screen)
        titles = [str(hit.text) async for hit in provider.discover()]
        assert "Review: approve candidate" in titles
        assert "Control: resume" not in titles  # nothing is paused
        # choose it through the palette
        await pilot.press("ctrl+p")
        await pilot.press(*"approve")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engines.engine.decisions) == 1)
        assert engines.engine.decisions[0][1].decision == "approve"
        app.reviewer.close()


# ---------------------------------------------------------------------- control


async def test_phase_control_sends_commands_and_disables_what_does_not_apply(
    make_engines, wait_for
) -> None:
    hold = 5  # RunStarted, PhaseStarted(weight), episodes...: inside the first weight phase
    engines = make_engines(hold_after=hold)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.phase_active)
        assert app.check_action("pause", ()) is True
        assert app.check_action("resume", ()) is None  # disabled, shown greyed
        await pilot.press("p")
        # CommandReceived and CommandApplied are separate events: a flush between them shows
        # "pausing", so wait for the state the user sees rather than the view's flag
        await wait_for(pilot, lambda: app.display_state() == "paused")
        assert app.display_state() == "paused"
        assert app.check_action("pause", ()) is None
        assert app.check_action("resume", ()) is True
        await pilot.press("g")
        await wait_for(pilot, lambda: not app.view.paused)
        app.action_probe()  # what "b" runs; checked before the UI can flush the result
        assert app.check_action("probe", ()) is None  # one probe at a time
        await wait_for(pilot, lambda: len(app.view.probes) == 1)
        assert app.check_action("probe", ()) is True
        await pilot.press("s")
        await wait_for(pilot, lambda: "switch" in engines.engine.received)
        # control tab buttons mirror the same rules
        await pilot.press("4")
        await pilot.pause()
        assert app.query_one("#btn-resume").disabled
        assert not app.query_one("#btn-stop").disabled
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.engine_running)
        await wait_for(pilot, lambda: app.view.finished == "stopped")
        assert engines.engine.received == ["pause", "resume", "probe", "switch", "stop"]
        for action in ("pause", "switch", "probe", "stop"):
            assert app.check_action(action, ()) is None
        # a stopped run can be resumed from the app: a new engine on the same folder
        assert app.check_action("resume", ()) is True
        root = app.run_root
        await pilot.press("g")
        await wait_for(pilot, lambda: len(engines.engines) == 2)
        assert app.run_root == root
        engines.engine.release.set()
        app.reviewer.close()
        await wait_for(pilot, lambda: not app.engine_running)
        app.flush_now()
        # both engine sessions, each event once: the same as reading the folder afresh
        assert app.view == replay(load_run_events(root))


async def test_quit_mid_phase_asks_and_stops_the_engine(make_engines, wait_for) -> None:
    engines = make_engines(hold_after=5)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.phase_active)
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert app.engine_running and not app.commands.stop_requested.is_set()
        await pilot.press("q")
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running)
    assert not app.engine_left_running
    assert app.return_code == 0
    root = app.run_root
    assert root is not None
    assert [e.status for e in events_of(root, RunFinished)] == ["stopped"]


async def test_quit_while_a_review_waits_never_hangs(make_engines, wait_for) -> None:
    engines = make_engines()
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running)
    assert not app.engine_left_running
    assert engines.engine.decisions == []
    finished = events_of(app.run_root, RunFinished)
    assert finished and finished[-1].message == "stopped while a review was pending"


async def test_quit_gives_up_on_an_engine_that_ignores_stop(make_engines, wait_for) -> None:
    release = threading.Event()
    engines = make_engines(ignore_stop=release)
    app = make_app(engine_factory=engines, stop_timeout=0.3)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
            await pilot.press("q")  # no phase started: no question, straight to stopping
            await wait_for(pilot, lambda: not app.is_running)
        assert app.engine_left_running
    finally:
        release.set()


async def test_engine_errors_become_a_readable_notification(make_engines, wait_for) -> None:
    engines = make_engines(fail_after=10)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: bool(app.engine_error))
        assert app.is_running
        assert app.engine_error == "RuntimeError: CUDA out of memory [bold]while[/bold] generating"
        assert app.display_state() == "failed"
        # `notify` posts a message: the toast lands on the next turn of the app's loop
        await wait_for(
            pilot, lambda: any("CUDA out of memory" in n.message for n in app._notifications)
        )
        log = (app.run_root / "tui.log").read_text()
        assert "Traceback" in log and "RuntimeError" in log
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running)
    assert app.return_code == 1


async def test_engine_that_cannot_open_is_reported(make_engines, wait_for) -> None:
    engines = make_engines()
    engines.fail_on_open = ModuleNotFoundError("No module named 'whale_lab.engine.engine'")
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(app.engine_error))
        assert "could not be loaded" in app.engine_error
        assert app.check_action("pause", ()) is None


# ---------------------------------------------------------------------- rollouts & traces


async def test_rollout_filters(fixture_run) -> None:
    app = make_app(run_dir=str(fixture_run), replay_only=True)
    async with app.run_test(size=SIZE) as pilot:
        panel = app.query_one(RolloutsPanel)
        table = app.query_one("#rollouts-table", DataTable)
        assert table.row_count == app.view.episode_count == 56
        await pilot.press("f")
        assert panel.filter == "failures"
        failures = [r for r in app.view.episodes if outcome(r.reward, r.stop_reason) != "success"]
        assert table.row_count == len(failures) > 0
        assert all(r.outcome != "success" for r in panel._shown)
        await pilot.press("f")
        assert panel.filter == "stop:answered"
        assert table.row_count == app.view.stop_counts["answered"]
        await pilot.press("F", "F")
        assert panel.filter == "all"
        assert table.row_count == 56
        # filter keys are hidden on other tabs
        await pilot.press("2")
        await pilot.pause()
        assert app.check_action("filter", (1,)) is False


async def test_open_trace_shows_model_text_verbatim(fixture_run) -> None:
    app = make_app(run_dir=str(fixture_run), replay_only=True)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f", "up")
        row = app.query_one(RolloutsPanel).selected_row()
        assert row is not None
        await pilot.press("enter")
        assert isinstance(app.screen, TraceScreen)
        text = app.screen.query_one("#trace-text", Static).render()
        plain = str(text)
        assert row.task_id in plain
        assert "[bold]not markup[/bold]" in plain  # shown as written, never as markup
        assert "[red]maybe[/red]" in plain
        await pilot.press("escape")
        assert not isinstance(app.screen, TraceScreen)


async def test_open_trace_in_a_live_run_reads_the_new_run_folder(make_engines, wait_for) -> None:
    engines = make_engines(hold_after=12)
    app = make_app(engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        await wait_for(pilot, lambda: app.view.episode_count >= 8)
        # The engine is held, so nothing more arrives; the table is redrawn at most once a second
        # (app.PACE), so draw it now: `o` opens the row the cursor is on, the newest episode.
        app.flush_now()
        await pilot.pause()
        await pilot.press("o")
        assert isinstance(app.screen, TraceScreen)
        assert app.screen.trace.task_id == app.view.episodes[-1].task_id
        await pilot.press("escape")
        engines.engine.release.set()
        app.reviewer.close()


async def test_missing_trace_is_a_notification_not_a_crash(fixture_run) -> None:
    (fixture_run / "traces" / "weight-c2.jsonl").unlink()
    app = make_app(run_dir=str(fixture_run), replay_only=True)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("o")
        assert not isinstance(app.screen, TraceScreen)
        assert any("trace file not found" in n.message for n in app._notifications)


# ---------------------------------------------------------------------- replay


async def test_replay_shows_the_same_state_as_live(make_engines, wait_for) -> None:
    engines = make_engines()
    live = make_app(engine_factory=engines)
    async with live.run_test(size=SIZE) as pilot:
        for cid in ("c1-i2-a", "c1-i2-b"):
            await wait_for(pilot, lambda cid=cid: live.reviewer.is_waiting(cid))
            await pilot.press("3")
            await wait_for(pilot, lambda: live.check_action("pin", ()) is True)
            await pilot.press("a")
        await wait_for(pilot, lambda: live.view.finished == "completed" and not live.engine_running)
        live.flush_now()
        root = live.run_root
        live_status = _status_text(live)
        live_rows = _table_rows(live, "#rollouts-table")
        live_cycles = _table_rows(live, "#cycles-table")
    assert root is not None
    assert replay(load_run_events(root)) == live.view

    again = make_app(run_dir=str(root), replay_only=True)
    async with again.run_test(size=SIZE):
        assert again.view == live.view
        assert _status_text(again) == live_status
        assert _table_rows(again, "#rollouts-table") == live_rows
        assert _table_rows(again, "#cycles-table") == live_cycles
        assert again.check_action("resume", ()) is None  # a completed run does not resume


async def test_opening_an_unfinished_run_resumes_it(
    interrupted_run, make_engines, wait_for
) -> None:
    engines = make_engines(hold_after=2)
    # replay-only: shown without an engine, resumable with a key
    app = make_app(run_dir=str(interrupted_run), replay_only=True, engine_factory=engines)
    async with app.run_test(size=SIZE) as pilot:
        assert not app.engine_running and app.display_state() == "replay"
        assert [e.status for e in app.review_entries()] == ["pending", "pending"]
        assert app.check_action("resume", ()) is True
        await pilot.press("g")
        await wait_for(pilot, lambda: engines.engines and engines.engine.holding.is_set())
        assert engines.engine.store.root == interrupted_run
        engines.engine.release.set()
        app.reviewer.close()
        await wait_for(pilot, lambda: not app.engine_running)


async def test_missing_run_folder(tmp_path, capsys) -> None:
    app = make_app(run_dir=str(tmp_path / "nope"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        assert not app.engine_running
        assert any("run folder not found" in n.message for n in app._notifications)
    assert run_tui(Config(), str(tmp_path / "nope")) == 2
    assert "run folder not found" in capsys.readouterr().err


async def test_bursts_are_batched_and_capped(tmp_path, wait_for) -> None:
    from whale_lab.events import EpisodeFinished, RunStarted
    from whale_lab.store import RunStore
    from whale_lab.tui.widgets import MAX_TABLE_ROWS

    class Burst:
        def __init__(self, store: RunStore) -> None:
            self.store = store

        def run(self) -> None:
            self.store.emit(
                RunStarted(run_id="burst", domain="math", model="m", schedule="whale", harness="h0")
            )
            for i in range(3000):
                self.store.emit(
                    EpisodeFinished(
                        phase="weight",
                        task_id=f"t{i}",
                        sample=0,
                        turns=1,
                        reward=float(i % 2),
                        stop_reason="answered",
                    )
                )
            self.store.emit(RunFinished(status="completed"))

    def factory(cfg, run_dir, reviewer, commands):
        store = RunStore(tmp_path / "burst")
        return Burst(store), store

    app = make_app(engine_factory=factory)
    refreshes = 0
    original = app._refresh

    def counting(changed, rebuild=False):
        nonlocal refreshes
        if "rollouts" in changed:
            refreshes += 1
        original(changed, rebuild)

    app._refresh = counting  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view.finished == "completed")
        app.flush_now()
        assert app.view.episode_count == 3000
        assert app.query_one("#rollouts-table", DataTable).row_count == MAX_TABLE_ROWS
        assert refreshes < 3000 / 10  # many episodes per redraw, never one per episode


# ---------------------------------------------------------------------- keys & help


async def test_help_lists_bindings_with_ids_and_keymap_remaps(make_engines, wait_for) -> None:
    engines = make_engines()
    app = make_app(engine_factory=engines, keymap={"review.approve": "y"})
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        rows = {bid: (key, state) for key, _, bid, state in app.screen.rows}
        assert rows["review.approve"][0] == "y"
        assert rows["control.pause"][1] in ("enabled", "disabled")
        assert {"app.quit", "control.stop", "review.reject", "rollouts.filter"} <= set(rows)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.reviewer.is_waiting("c1-i2-a"))
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("approve", ()) is True)
        await pilot.press("y")
        await wait_for(pilot, lambda: len(engines.engine.decisions) == 1)
        assert engines.engine.decisions[0][1].decision == "approve"
        app.reviewer.close()


def test_bad_keymap_is_a_clear_error(tmp_path, capsys, monkeypatch) -> None:
    from whale_lab.tui.keys import KeymapError, load_keymap

    path = tmp_path / "keys.toml"
    path.write_text('[keys]\n"review.aprove" = "y"\n')
    with pytest.raises(
        KeymapError,
        match=r"keys.review.aprove: unknown binding id \(did you mean "
        r"'review.approve'\?\)",
    ):
        load_keymap(path)
    path.write_text('[keys]\n"review.approve" = 3\n')
    with pytest.raises(KeymapError, match="expected a key name string"):
        load_keymap(path)
    monkeypatch.setenv("WHALE_LAB_KEYMAP", str(tmp_path / "missing.toml"))
    assert run_tui(Config()) == 2
    assert "keymap file not found" in capsys.readouterr().err


# ---------------------------------------------------------------------- helpers


def _status_text(app: WhaleLabApp) -> list[str]:
    return [
        str(app.query_one(f"#{wid}", Static).render())
        for wid in ("status-run", "status-phase-label", "status-accounting")
    ]


def _table_rows(app: WhaleLabApp, selector: str) -> list[list[str]]:
    table = app.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]
