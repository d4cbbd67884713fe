"""The whale-lab Textual app: watch a run, review harness diffs, steer the phases.

The engine runs in one thread worker (`engine_worker`). It reaches the UI only through a
thread-safe inbox (events from `RunStore` listeners) that a timer drains every `flush_interval`
seconds into the view model (`state.RunView`), and through `post_message`. Commands go back
through a `CommandChannel` (`control`); review decisions through `ThreadReviewer`, read and
decided through one `ReviewQueue` (`review_actions`). Nothing here imports torch, transformers,
peft or vllm: the engine is imported inside the worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets import DataTable, Footer, OptionList, TabbedContent, TabPane
from textual.worker import Worker

from whale_lab.config import Config
from whale_lab.engine.runlock import holder as run_holder
from whale_lab.engine.runs import from_cwd as shown_path
from whale_lab.events import Event, event_from_dict
from whale_lab.quiet import quiet_libraries
from whale_lab.reviewers import ThreadReviewer
from whale_lab.seams import Command, CommandChannel
from whale_lab.tui.commands import WhaleCommands
from whale_lab.tui.control import CONTROL_ACTIONS, ControlActions, refusal_reason
from whale_lab.tui.engine_worker import (
    EngineAttached,
    EngineFactory,
    EngineWorker,
    default_engine_factory,
    describe_error,
)
from whale_lab.tui.keys import APP_BINDINGS, KeymapError, effective_keys, validate_keymap
from whale_lab.tui.launcher import Launcher
from whale_lab.tui.review_actions import PACK_ACTIONS, ReviewActions
from whale_lab.tui.review_queue import ReviewQueue
from whale_lab.tui.screens import ConfirmScreen, HelpScreen, TraceScreen
from whale_lab.tui.state import (
    RunFolderError,
    RunView,
    filter_label,
    load_run_events,
    load_trace,
)
from whale_lab.tui.terminal import CallbackLogHandler, TerminalGuard
from whale_lab.tui.widgets import (
    AccuracyPanel,
    ControlPanel,
    LogPanel,
    ReviewPanel,
    RolloutsPanel,
    StatusPanel,
)

__all__ = [
    "CONTROL_ACTIONS",
    "EngineAttached",
    "EngineFactory",
    "WhaleLabApp",
    "default_engine_factory",
    "describe_error",
    "run_tui",
]

TABS = ("rollouts", "accuracy", "review", "control", "log")
REVIEW_ACTIONS = ("approve", "reject", "edit", "pin", *PACK_ACTIONS)
ROLLOUT_ACTIONS = ("filter", "open_trace")
MAX_EVENTS_PER_FLUSH = 20_000
OUTPUT_LOG = "tui-output.log"  # what libraries write to the terminal, in the run folder
#: Areas the flush timer redraws together at most once every `PACE` seconds. Each redraw of
#: them is a layout pass over the whole screen (the header's lines, the rollouts table growing),
#: the UI thread's largest cost (benchmarks/cycle_split.py --app --profile-ui), and it takes the
#: GIL from the engine; drawn together, they cost one pass, and nobody reads rows faster.
PACED = ("status", "rollouts", "accuracy", "log")
PACE = 1.0
DEFERRED_AREAS = ("rollouts", "accuracy", "control")
TAB_FOCUS = {
    "rollouts": "#rollouts-table",
    "accuracy": "#cycles-table",
    "review": "#review-list",
    "control": "#control-buttons Button",
    "log": "#log",
}


class WhaleLabApp(Launcher, ControlActions, ReviewActions, EngineWorker, App[int]):
    """Dashboard for one run: live from the engine, or replayed from a run folder."""

    CSS_PATH = "app.tcss"
    TITLE = "whale-lab"
    BINDINGS: ClassVar[list[Binding]] = APP_BINDINGS  # type: ignore[assignment]
    COMMANDS = App.COMMANDS | {WhaleCommands}

    def __init__(
        self,
        cfg: Config,
        *,
        run_dir: str | None = None,
        engine_factory: EngineFactory | None = None,
        replay_only: bool = False,
        keymap: dict[str, str] | None = None,
        flush_interval: float = 0.2,
        stop_timeout: float = 120.0,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.run_dir = str(run_dir) if run_dir is not None else None
        self.engine_factory: EngineFactory = engine_factory or default_engine_factory
        self.replay_only = replay_only
        self.keymap = validate_keymap(dict(keymap or {}), source="keymap")
        self.flush_interval = flush_interval
        self.stop_timeout = stop_timeout
        self.view = RunView()
        self.run_root: Path | None = Path(run_dir) if run_dir is not None else None
        self.commands = CommandChannel()
        self.reviewer = ThreadReviewer(self.commands, on_request=self._on_review_request)
        self.reviews = ReviewQueue(self.view, self.reviewer)
        self.terminal_guard: TerminalGuard | None = None
        self.engine_left_running = False
        self.engine_error: str = ""
        self._inbox: deque[Event] = deque()
        self._notices: deque[tuple[str, str]] = deque(maxlen=500)
        self._engine_worker: Worker[Any] | None = None
        self._engine_started = False
        self._exiting = False
        self._pause_sent = False
        self._probe_sent = False
        self._switch_sent = False
        self.read_only_pid: int | None = None  # another process holds the run: we only watch
        self._tail_offset = 0
        self._last_status = 0.0
        self._log_handler: CallbackLogHandler | None = None
        self._main_screen: Screen[Any] | None = None
        self._bindings_signature: tuple[Any, ...] = ()
        self._dirty: set[str] = set()
        self._paced: set[str] = set()  # areas changed since their last paced redraw
        self._paced_at = float("-inf")
        self._shown_root: tuple[Path | None, str] = (None, "")
        self._starts_at_launch = 0
        if self.keymap:
            self.set_keymap(self.keymap)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        yield StatusPanel(id="status")
        with TabbedContent(id="tabs", initial="rollouts"):
            with TabPane("Rollouts", id="rollouts"):
                yield RolloutsPanel(id="rollouts-panel")
            with TabPane("Accuracy", id="accuracy"):
                yield AccuracyPanel(id="accuracy-panel")
            with TabPane("Review", id="review"):
                yield ReviewPanel(id="review-panel")
            with TabPane("Control", id="control"):
                yield ControlPanel(id="control-panel")
            with TabPane("Log", id="log"):
                yield LogPanel(id="log-panel")
        yield Footer()

    def get_driver_class(self) -> Any:
        """Textual's driver, sized from the terminal it draws on (see `tui.driver`)."""
        from whale_lab.tui.driver import measured_driver

        return measured_driver(super().get_driver_class())

    def _bindings_changed(self) -> None:
        """Ask the footer to re-check which actions apply, when any of them changed.

        Refreshing recomposes the footer, so it happens only when the answer differs.
        """
        if not (self.screen_stack and self.is_running):
            return
        signature = (
            id(self.screen),
            tuple(self.check_action(b.action.split("(", 1)[0], ()) for b in APP_BINDINGS),
        )
        if signature != self._bindings_signature:
            self._bindings_signature = signature
            self.refresh_bindings()

    def _q(self, selector: Any, expect_type: Any = None) -> Any:
        """Query the dashboard screen, whichever screen is on top."""
        if self._main_screen is None:
            raise NoMatches("the dashboard is not mounted")
        if expect_type is None:
            return self._main_screen.query_one(selector)
        return self._main_screen.query_one(selector, expect_type)

    def on_mount(self) -> None:
        self._main_screen = self.screen
        self._log_handler = CallbackLogHandler(lambda lvl, msg: self._notices.append((lvl, msg)))
        logging.getLogger().addHandler(self._log_handler)
        if self.run_dir is not None:
            try:
                history = load_run_events(self.run_dir)
            except RunFolderError as exc:
                self._notice("error", str(exc))
                self.notify(str(exc), severity="error", markup=False, timeout=10)
                history = []
                self.replay_only = True
            self.view.apply_all(history)
            self._open_read_only_if_held()
        self._refresh_all()
        self._q("#rollouts-table", DataTable).focus()
        self.set_interval(self.flush_interval, self._flush_events)
        if not self.replay_only and self.view.finished != "completed":
            self.launch()  # the engine, or first the question of which run (`launcher`)

    def _open_read_only_if_held(self) -> None:
        """A run another process has open is shown read-only, following what it writes."""
        assert self.run_dir is not None
        pid = run_holder(Path(self.run_dir))
        if pid is None or self.view.finished == "completed":
            return
        self.read_only_pid, self.replay_only = pid, True
        try:
            self._tail_offset = (Path(self.run_dir) / "events.jsonl").stat().st_size
        except OSError:
            self._tail_offset = 0
        message = f"This run is open in process {pid}: shown read-only, following its events."
        self._notice("warning", message)
        self.notify(message, title="read-only", markup=False, timeout=10)
        self.set_interval(1.0, self._follow_holder)

    def _follow_holder(self) -> None:
        """New events the holding process wrote; when it lets go, say that the run is free."""
        if self.read_only_pid is None or self.run_dir is None:
            return
        try:
            with open(Path(self.run_dir) / "events.jsonl", "rb") as fh:
                fh.seek(self._tail_offset)
                data = fh.read()
        except OSError:
            data = b""
        end = data.rfind(b"\n")
        if end >= 0:
            self._tail_offset += end + 1
            for line in data[:end].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                ev = event_from_dict(rec) if isinstance(rec, dict) else None
                if ev is not None:
                    self._inbox.append(ev)
        if run_holder(Path(self.run_dir)) is None:
            pid, self.read_only_pid = self.read_only_pid, None
            self.notify(
                f"Process {pid} closed this run; resume (g) continues it here.",
                title="read-only",
                markup=False,
            )
            self._refresh({"status", "control"})

    def on_unmount(self) -> None:
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
        if self.engine_running:
            self.commands.send(Command("stop", by="tui", reason="app closed"))
        self.reviewer.close()

    # ------------------------------------------------------------------ flushing

    def _flush_events(self) -> None:
        """Drain the inbox into the view and redraw only what changed (runs on a timer)."""
        try:
            self._flush_inner()
        except NoMatches:
            pass  # the app is closing and the panels are gone

    def _flush_inner(self) -> None:
        batch: list[Event] = []
        while self._inbox and len(batch) < MAX_EVENTS_PER_FLUSH:
            batch.append(self._inbox.popleft())
        changed = self.view.apply_all(batch)
        queue_changed, arrived = self.reviews.sync()
        if queue_changed:
            for cid in arrived:
                self.notify(
                    f"Candidate {cid} awaits your review (tab 3).", title="review", markup=False
                )
            changed |= {"reviews", "status", "control"}
        self.reviews.observe(batch)
        self.observe_steer(batch)
        self._control_events(batch)
        now = time.monotonic()
        if now - self._last_status >= 1.0:
            changed.add("status")
        while self._notices:
            level, msg = self._notices.popleft()
            self._q(LogPanel).notice(level, msg)
        if changed & {"status", "reviews"}:
            changed.add("control")  # its buttons follow the engine's state
        changed = self._pace(changed, now)
        if changed:
            self._refresh(changed)

    def _pace(self, changed: set[str], now: float) -> set[str]:
        """Hold back the `PACED` areas until `PACE` seconds after their last redraw, then draw
        every one that changed meanwhile in one go (nothing that changed is dropped)."""
        self._paced |= changed & set(PACED)
        changed -= set(PACED)
        if self._paced and now - self._paced_at >= PACE:
            changed |= self._paced
            self._paced = set()
            self._paced_at = now
        return changed

    def flush_now(self) -> None:
        """Apply everything queued so far and redraw every panel (tests, and before quitting)."""
        while self._inbox:
            self._flush_events()
        self._flush_events()
        self._refresh(self._dirty | self._paced, rebuild=True)
        self._paced.clear()

    def _refresh_all(self) -> None:
        self._refresh(
            set(("status", "rollouts", "accuracy", "reviews", "control", "log")), rebuild=True
        )

    def _refresh(self, changed: set[str], rebuild: bool = False) -> None:
        try:
            self._refresh_inner(changed, rebuild)
        except NoMatches:
            pass  # the app is closing and the panels are gone

    def _refresh_inner(self, changed: set[str], rebuild: bool) -> None:
        # Heavy panels on hidden tabs are redrawn when their tab is shown, not on every flush.
        if not rebuild:
            active = self.active_tab()
            for area in DEFERRED_AREAS:
                if area in changed and area != active:
                    changed.discard(area)
                    self._dirty.add(area)
        if "status" in changed:
            self._last_status = time.monotonic()
            self.view.activity.live = self.engine_running
            self._q(StatusPanel).update_view(
                self.view,
                state=self.display_state(),
                fallback=self._fallback(),
                elapsed=self._elapsed(),
            )
        if "rollouts" in changed:
            panel = self._q(RolloutsPanel)
            if rebuild:
                panel.rebuild(self.view)
            else:
                panel.update_view(self.view)
        if "accuracy" in changed:
            self._q(AccuracyPanel).update_view(self.view)
        if "reviews" in changed:
            entries = self.review_entries()
            self._q(ReviewPanel).update_view(entries, self.reviews.live_ids)
            pending = sum(1 for e in entries if e.status == "pending")
            tab = self._q(TabbedContent).get_tab("review")
            label = f"Review ({pending})" if pending else "Review"
            if tab.label.plain != label:
                tab.label = Text(label)
        if "control" in changed:
            self._q(ControlPanel).update_view(
                self.view,
                state_text=self._control_state_text(),
                enabled={a: self.action_applies(a) for a in CONTROL_ACTIONS},
                keys=effective_keys(self.keymap),
            )
        if "log" in changed:
            self._q(LogPanel).update_view(self.view)
        self._dirty -= changed
        self._bindings_changed()

    # ------------------------------------------------------------------ derived state

    def _fallback(self) -> dict[str, str]:
        return {
            "run": self.run_root.name if self.run_root else "",
            "path": self._shown_run_path(),
            "note": self._status_note(),
            "model": self.cfg.model.path,
            "domain": self.cfg.domain.name,
            "schedule": self.cfg.schedule.kind,
        }

    def _shown_run_path(self) -> str:
        if self._shown_root[0] != self.run_root:
            shown = shown_path(self.run_root) if self.run_root is not None else ""
            self._shown_root = (self.run_root, shown)
        return self._shown_root[1]

    def _status_note(self) -> str:
        if self.read_only_pid is not None:
            return f"read-only: open in process {self.read_only_pid}"
        if self._switch_sent and self.engine_running:
            return "switch requested"
        return ""

    def _elapsed(self) -> float:
        if self.engine_running and self.view.segment_start is not None:
            return self.view.elapsed(now=time.time())
        return self.view.elapsed()

    def active_tab(self) -> str:
        try:
            return self._q(TabbedContent).active or "rollouts"
        except Exception:  # noqa: BLE001 - before mount
            return "rollouts"

    def action_applies(self, action: str) -> bool:
        """Whether an action makes sense in the current state (screens aside)."""
        name = action.split("(", 1)[0]
        if name in CONTROL_ACTIONS:
            return name in self.applicable_controls()
        if name in REVIEW_ACTIONS:
            return self.review_applies(name)
        if name == "open_trace":
            try:
                row = self._q(RolloutsPanel).selected_row()
            except Exception:  # noqa: BLE001 - before mount
                return False
            return row is not None and row.trace_line >= 0 and bool(row.trace_path)
        return True

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        on_main = len(self.screen_stack) <= 1
        if action in CONTROL_ACTIONS:
            if not on_main and not isinstance(self.screen, TraceScreen):
                return False
            return True if self.action_applies(action) else None
        if action in REVIEW_ACTIONS:
            if not on_main or self.active_tab() != "review":
                return False
            return True if self.action_applies(action) else None
        if action in ROLLOUT_ACTIONS:
            if not on_main or self.active_tab() != "rollouts":
                return False
            return True if self.action_applies(action) else None
        if action in ("show_tab", "help") and not on_main:
            return False
        return True

    # ------------------------------------------------------------------ events from widgets

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if self._dirty:
            self._refresh(set(self._dirty))
        # keys (arrows, Enter) go to the tab's main widget, not one left on a hidden tab
        target = TAB_FOCUS.get(self.active_tab())
        if target and self._main_screen is not None:
            for widget in self._main_screen.query(target):
                if widget.focusable:
                    widget.focus()
                    break
        self._bindings_changed()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option_list.id == "review-list":
            self._bindings_changed()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "rollouts-table":
            self._bindings_changed()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "rollouts-table":
            self.action_open_trace()

    def on_key(self, event: events.Key) -> None:
        """A key of an action that does not apply now says so, instead of doing nothing."""
        if len(self.screen_stack) > 1:
            return
        binding = self._key_to_binding().get(event.key)
        if binding is None:
            return
        name = binding.action.split("(", 1)[0]
        state = self.check_action(name, ())
        if state is False:
            tab, key = ("review", "3") if name in REVIEW_ACTIONS else ("rollouts", "1")
            self.notify(
                f"{binding.description} works on the {tab.title()} tab (press {key}).",
                timeout=3,
                markup=False,
            )
        elif state is None:
            self.notify(
                f"{binding.description} does not apply now ({self._why_not(name)}).",
                severity="warning",
                timeout=3,
                markup=False,
            )

    def _key_to_binding(self) -> dict[str, Binding]:
        out: dict[str, Binding] = {}
        for b in APP_BINDINGS:
            name = b.action.split("(", 1)[0]
            if b.id and (
                name in CONTROL_ACTIONS or name in REVIEW_ACTIONS or name in ROLLOUT_ACTIONS
            ):
                for key in (self.keymap.get(b.id) or b.key).split(","):
                    out[key.strip()] = b
        return out

    def _why_not(self, action: str) -> str:
        if action in REVIEW_ACTIONS:
            return self.review_refusal(action)
        if action == "open_trace":
            return "no episode with a trace is selected"
        return refusal_reason(action, self.control_inputs())

    # ------------------------------------------------------------------ actions: general

    def action_show_tab(self, tab: str) -> None:
        if tab in TABS:
            self._q(TabbedContent).active = tab

    def action_help(self) -> None:
        keys = effective_keys(self.keymap)
        rows = []
        for b in APP_BINDINGS:
            if not b.id:
                continue
            state = "enabled" if self.action_applies(b.action) else "disabled"
            rows.append((keys[b.id], b.description, b.id, state))
        rows.append(("ctrl+p", "Command palette", "(textual)", "enabled"))
        self.push_screen(HelpScreen(rows))

    async def action_quit(self) -> None:
        """Ask first whenever work would be cut; then stop the engine at a safe point and leave."""
        if self._exiting:
            self.force_exit()
            return
        if self.engine_running and self.display_state() in ("running", "pausing", "paused"):
            question = (
                f"{self._work_under_way()} Stop the engine at the next safe point and quit? "
                "The run folder can be resumed later."
            )

            def answered(yes: bool | None) -> None:
                if yes:
                    self.begin_shutdown()

            self.push_screen(ConfirmScreen(question), answered)
            return
        self.begin_shutdown()

    def _work_under_way(self) -> str:
        """What quitting now would cut, in one sentence."""
        act = self.view.activity.activity
        if act is not None:
            return f"The engine is busy ({act.text()})."
        if self.view.phase_active:
            return f"A {self.view.phase} phase is mid-way."
        if self.reviews.live_ids:
            return "A candidate awaits your review."
        return "The engine is running."

    # ------------------------------------------------------------------ actions: rollouts

    def action_filter(self, step: int = 1) -> None:
        panel = self._q(RolloutsPanel)
        options = panel.filters(self.view)
        idx = options.index(panel.filter) if panel.filter in options else 0
        panel.set_filter(options[(idx + step) % len(options)], self.view)
        self._bindings_changed()
        self.notify(f"Rollouts: {filter_label(panel.filter)}", timeout=2, markup=False)

    def action_open_trace(self) -> None:
        row = self._q(RolloutsPanel).selected_row()
        if row is None:
            return self._refuse("Open trace")
        try:
            trace = load_trace(self.run_root, row)
        except (RunFolderError, OSError) as exc:
            self.notify(str(exc), severity="error", markup=False)
            return
        title = (
            f" episode {row.index + 1}: {row.task_id} sample {row.sample} · "
            f"{row.phase} · {row.stop_reason} · reward {row.reward:.2f}"
        )
        self.push_screen(TraceScreen(trace, title))

    # ------------------------------------------------------------------ helpers

    def _notice(self, level: str, message: str) -> None:
        self._notices.append((level, message))

    def _refuse(self, action: str) -> None:
        self.notify(f"{action} does not apply right now.", severity="warning", markup=False)


def run_tui(
    cfg: Config,
    run_dir: str | None = None,
    *,
    replay_only: bool = False,
    keymap_path: str | None = None,
) -> int:
    """Entry point for `whale-lab` (no subcommand) and `whale-lab tui --run DIR`.

    Returns a process exit code; user mistakes (a missing run folder, a bad keymap) print one
    line to stderr and return 2 without starting the app.
    """
    from whale_lab.tui.keys import default_keymap_path, load_keymap

    quiet_libraries()
    try:
        keymap = load_keymap(keymap_path or default_keymap_path())
    except KeymapError as exc:
        print(f"whale-lab: {exc}", file=sys.stderr)
        return 2
    if run_dir is not None:
        try:
            load_run_events(run_dir)
        except RunFolderError as exc:
            print(f"whale-lab: {exc}", file=sys.stderr)
            return 2
    app = WhaleLabApp(cfg, run_dir=run_dir, replay_only=replay_only, keymap=keymap)
    app.offer_runs = run_dir is None  # a bare `whale-lab`: resume or start new (`launcher`)
    # a new run's folder is made by the engine: until then the output waits beside it
    early_log = Path(cfg.run.directory) / f".tui-output-{os.getpid()}.log"
    log_path = Path(run_dir) / OUTPUT_LOG if run_dir is not None else early_log
    loop = asyncio.new_event_loop()
    with TerminalGuard(log_path) as guard:
        app.terminal_guard = guard
        app.run(loop=loop)
    code = app.return_code if app.return_code is not None else app._exit_code()
    if app.engine_left_running:
        where = f" with `whale-lab tui --run {app.run_root}`" if app.run_root else ""
        print(
            "whale-lab: the engine did not reach a safe point in time; leaving it. "
            f"The run folder is intact and can be resumed{where}.",
            file=sys.stderr,
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(code or 0)
    try:
        loop.run_until_complete(loop.shutdown_default_executor())
    finally:
        loop.close()
    if app.engine_error:
        print(f"whale-lab: the engine stopped with an error: {app.engine_error}", file=sys.stderr)
    elif app._engine_started and app.run_root is not None and app.view.finished != "completed":
        print(
            "whale-lab: the run stopped at a safe point; continue it with "
            f"`whale-lab resume {shown_path(app.run_root)}`",
            file=sys.stderr,
        )
    return int(code or 0)
