"""The whale-lab Textual app: watch a run, review harness diffs, steer the phases.

The engine runs in one thread worker. It reaches the UI only through a thread-safe inbox (events
from `RunStore` listeners) that a timer drains every `flush_interval` seconds into the view
model (`state.RunView`), and through `post_message`. Commands go back through a
`CommandChannel`; review decisions through `ThreadReviewer`. Nothing here imports torch,
transformers, peft or vllm: the engine is imported inside the worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import events, work
from textual.app import App, ComposeResult, SuspendNotSupported
from textual.binding import Binding
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, OptionList, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from whale_lab.config import Config
from whale_lab.events import Event
from whale_lab.quiet import quiet_libraries
from whale_lab.reviewers import ThreadReviewer
from whale_lab.seams import Command, CommandChannel, ReviewDecision
from whale_lab.tui import render
from whale_lab.tui.commands import WhaleCommands
from whale_lab.tui.keys import APP_BINDINGS, KeymapError, effective_keys, validate_keymap
from whale_lab.tui.screens import (
    ConfirmScreen,
    HelpScreen,
    ReasonScreen,
    StoppingScreen,
    TraceScreen,
)
from whale_lab.tui.state import (
    ReviewEntry,
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

EngineFactory = Callable[[Config, "str | None", ThreadReviewer, CommandChannel], tuple[Any, Any]]

TABS = ("rollouts", "accuracy", "review", "control", "log")
CONTROL_ACTIONS = ("pause", "resume", "switch", "probe", "stop")
REVIEW_ACTIONS = ("approve", "reject", "edit", "pin")
ROLLOUT_ACTIONS = ("filter", "open_trace")
MAX_EVENTS_PER_FLUSH = 20_000
DEFERRED_AREAS = ("rollouts", "accuracy", "control")
TAB_FOCUS = {
    "rollouts": "#rollouts-table",
    "accuracy": "#cycles-table",
    "review": "#review-list",
    "control": "#control-buttons Button",
    "log": "#log",
}


def default_engine_factory(
    cfg: Config, run_dir: str | None, reviewer: ThreadReviewer, commands: CommandChannel
) -> tuple[Any, Any]:
    """The real engine, imported here (in the worker thread) so the TUI stays light."""
    quiet_libraries()
    from whale_lab.engine.engine import open_engine

    return open_engine(cfg, run_dir, reviewer=reviewer, commands=commands)


class EngineAttached(Message):
    """Posted from the engine thread once the run folder is known."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root


def describe_error(error: BaseException | None) -> str:
    """One readable line for an engine failure (the traceback goes to the run's tui.log)."""
    if error is None:
        return "unknown error"
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, ImportError | ModuleNotFoundError):
        return f"the engine could not be loaded ({text or type(error).__name__})"
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class WhaleLabApp(App[int]):
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
        self._local_decisions: dict[str, str] = {}
        self._live_ids: set[str] = set()
        self._review_wakeup = False
        self._last_status = 0.0
        self._log_handler: CallbackLogHandler | None = None
        self._main_screen: Screen[Any] | None = None
        self._bindings_signature: tuple[Any, ...] = ()
        self._dirty: set[str] = set()
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
        self._refresh_all()
        self._q("#rollouts-table", DataTable).focus()
        self.set_interval(self.flush_interval, self._flush_events)
        if not self.replay_only and self.view.finished != "completed":
            self.start_engine()

    def on_unmount(self) -> None:
        if self._log_handler is not None:
            logging.getLogger().removeHandler(self._log_handler)
        if self.engine_running:
            self.commands.send(Command("stop", by="tui", reason="app closed"))
        self.reviewer.close()

    # ------------------------------------------------------------------ engine worker

    @property
    def engine_running(self) -> bool:
        w = self._engine_worker
        return w is not None and w.state in (WorkerState.PENDING, WorkerState.RUNNING)

    def start_engine(self) -> None:
        """Start (or, on a stopped run folder, resume) the engine in the worker thread."""
        if self.engine_running:
            return
        if self._engine_started:
            # a fresh channel and reviewer: the old ones carry a stop request
            self.commands = CommandChannel()
            self.reviewer = ThreadReviewer(self.commands, on_request=self._on_review_request)
        self._engine_started = True
        self._pause_sent = self._probe_sent = False
        self.engine_error = ""
        run_dir = str(self.run_root) if self.run_root is not None else None
        # events of this run folder the view already holds (from a replay or an earlier engine)
        self.flush_now()
        known = self.view.event_count if run_dir is not None else 0
        self._starts_at_launch = self.view.starts
        self._engine_worker = self._run_engine(run_dir, known, self.reviewer, self.commands)
        self._refresh_all()

    @work(thread=True, exclusive=True, exit_on_error=False, group="engine", name="engine")
    def _run_engine(
        self, run_dir: str | None, known: int, reviewer: ThreadReviewer, commands: CommandChannel
    ) -> str:
        engine, store = self.engine_factory(self.cfg, run_dir, reviewer, commands)
        try:
            root = Path(store.root)
            self.post_message(EngineAttached(root))
            # anything written before we subscribed (and after the history the app replayed)
            for ev in store.events()[known:]:
                self._inbox.append(ev)
            store.subscribe(self._inbox.append)
            engine.run()
        finally:
            close = getattr(store, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001 - already finished; nothing to save
                    pass
        return "done"

    def on_engine_attached(self, message: EngineAttached) -> None:
        self.run_root = message.root
        self.run_dir = str(message.root)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker is not self._engine_worker:
            return
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            self.engine_error = describe_error(error)
            self._write_traceback(error)
            msg = f"The engine stopped with an error: {self.engine_error}"
            where = f" (details in {self.run_root / 'tui.log'})" if self.run_root else ""
            self._notice("error", msg + where)
            self.notify(msg, title="engine", severity="error", timeout=15, markup=False)
        elif event.state == WorkerState.SUCCESS and not self._exiting:
            self.notify("The engine has finished.", title="engine", markup=False)
        self._flush_events()
        self._refresh_all()

    def _write_traceback(self, error: BaseException | None) -> None:
        if error is None or self.run_root is None:
            return
        try:
            self.run_root.mkdir(parents=True, exist_ok=True)
            with open(self.run_root / "tui.log", "a", encoding="utf-8") as fh:
                fh.write(time.strftime("%Y-%m-%d %H:%M:%S engine error\n"))
                fh.write("".join(traceback.format_exception(error)))
        except OSError:
            pass

    def _on_review_request(self, item: object) -> None:
        """Engine thread: a candidate waits; the next flush shows it."""
        self._review_wakeup = True

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
        live = {item.candidate_id for item in self.reviewer.pending()}
        if live != self._live_ids or self._review_wakeup:
            for cid in sorted(live - self._live_ids):
                self.notify(
                    f"Candidate {cid} awaits your review (tab 3).", title="review", markup=False
                )
            self._live_ids = live
            self._review_wakeup = False
            changed |= {"reviews", "status", "control"}
        for ev in batch:
            if getattr(ev, "type", "") == "review_decided":
                self._local_decisions.pop(getattr(ev, "candidate_id", ""), None)
            if getattr(ev, "type", "") == "probe_result":
                self._probe_sent = False
                self.notify(
                    f"Probe: {getattr(ev, 'recommendation', '')}",
                    title="probe",
                    markup=False,
                    timeout=10,
                )
            if getattr(ev, "type", "") == "command_received" and getattr(ev, "command", "") in (
                "resume",
                "stop",
            ):
                self._pause_sent = False
        now = time.monotonic()
        if now - self._last_status >= 1.0:
            changed.add("status")
        while self._notices:
            level, msg = self._notices.popleft()
            self._q(LogPanel).notice(level, msg)
        if changed & {"status", "reviews"}:
            changed.add("control")  # its buttons follow the engine's state
        if changed:
            self._refresh(changed)

    def flush_now(self) -> None:
        """Apply everything queued so far and redraw every panel (tests, and before quitting)."""
        while self._inbox:
            self._flush_events()
        self._flush_events()
        self._refresh(set(self._dirty), rebuild=True)

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
            self._q(ReviewPanel).update_view(entries, self._live_ids)
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
            "model": self.cfg.model.path,
            "domain": self.cfg.domain.name,
            "schedule": self.cfg.schedule.kind,
        }

    def _elapsed(self) -> float:
        if self.engine_running and self.view.segment_start is not None:
            return self.view.elapsed(now=time.time())
        return self.view.elapsed()

    def display_state(self) -> str:
        """The header badge: live engine state, or what the run folder says."""
        if self.engine_running:
            if self.commands.stop_requested.is_set() or self.view.stopping:
                return "stopping"
            if self.view.paused or self._pause_sent:
                return "paused"
            if self.view.starts == self._starts_at_launch:
                return "starting"  # loading the model; no RunStarted from this engine yet
            return self.view.finished or "running"
        if self.engine_error:
            return "failed"
        if self.view.finished:
            return self.view.finished
        return "replay" if self.view.event_count else "waiting"

    def _control_state_text(self) -> Text:
        t = Text()
        state = self.display_state()
        t.append(f" {state.upper()} ", style=f"reverse {render.STATE_STYLE.get(state, 'bold')}")
        if self.engine_running:
            t.append("  engine running in the background", style="dim")
        elif self.can_resume_run():
            t.append("  no engine: resume (g) continues this run from its folder", style="dim")
        else:
            t.append("  no engine attached", style="dim")
        if self.engine_error:
            t.append(f"\nlast error: {self.engine_error}", style="red")
        if self.view.commands:
            t.append("\ncommands: " + ", ".join(list(self.view.commands)[-6:]), style="dim")
        return t

    def can_resume_run(self) -> bool:
        return (
            not self.engine_running
            and not self._exiting
            and self.run_root is not None
            and self.view.event_count > 0
            and self.view.finished != "completed"
        )

    def review_entries(self) -> list[ReviewEntry]:
        """Pending (live or recorded) first, then the 20 latest decisions, newest first."""
        entries: dict[str, ReviewEntry] = dict(self.view.reviews)
        for item in self.reviewer.pending():
            known = entries.get(item.candidate_id)
            if known is None or known.status != "pending":
                entries[item.candidate_id] = ReviewEntry(
                    candidate_id=item.candidate_id,
                    diff=item.diff,
                    hypothesis=item.hypothesis,
                    surface=item.surface,
                    smoke_success=item.smoke_success,
                    cited_traces=tuple(item.cited_traces),
                )
        out: list[ReviewEntry] = []
        for cid, entry in entries.items():
            local = self._local_decisions.get(cid)
            if local and entry.status == "pending":
                entry = ReviewEntry(**{**entry.__dict__, "status": local, "reason": "sent"})
            out.append(entry)
        pending = [e for e in out if e.status == "pending"]
        decided = [e for e in out if e.status != "pending"][-20:][::-1]
        return pending + decided

    def active_tab(self) -> str:
        try:
            return self._q(TabbedContent).active or "rollouts"
        except Exception:  # noqa: BLE001 - before mount
            return "rollouts"

    def _selected_review(self) -> str | None:
        try:
            return self._q(ReviewPanel).selected_id()
        except Exception:  # noqa: BLE001 - before mount
            return None

    def action_applies(self, action: str) -> bool:
        """Whether an action makes sense in the current state (screens aside)."""
        name = action.split("(", 1)[0]
        running = self.engine_running and not self._exiting
        stopping = self.commands.stop_requested.is_set() or self.view.stopping
        paused = self.view.paused or self._pause_sent
        if name == "pause":
            return running and not stopping and not paused
        if name == "resume":
            return (running and paused and not stopping) or self.can_resume_run()
        if name == "switch":
            return (
                running
                and not stopping
                and self.view.phase_active
                and self.view.phase in ("weight", "harness")
            )
        if name == "probe":
            return running and not stopping and not self.view.probe_running and not self._probe_sent
        if name == "stop":
            return running and not stopping
        if name in REVIEW_ACTIONS:
            cid = self._selected_review()
            return cid is not None and self.reviewer.is_waiting(cid)
        if name == "open_trace":
            try:
                row = self._q(RolloutsPanel).selected_row()
            except Exception:  # noqa: BLE001 - before mount
                return False
            return row is not None and row.trace_line >= 0 and bool(row.trace_path)
        if name == "filter":
            return True
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
            return "no candidate is waiting for a decision"
        if action == "open_trace":
            return "no episode with a trace is selected"
        if not self.engine_running:
            return "no engine is running" if action != "resume" else "nothing to resume"
        if self.commands.stop_requested.is_set() or self.view.stopping:
            return "the engine is stopping"
        if action == "pause":
            return "already paused"
        if action == "resume":
            return "not paused"
        if action == "probe":
            return "a probe is already running"
        if action == "switch":
            return "no weight or harness phase is running"
        return "not in this state"

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
        """Ask first when a phase is mid-way; then stop the engine at a safe point and leave."""
        if self._exiting:
            self.force_exit()
            return
        if self.engine_running and (self.view.phase_active or self._live_ids):
            question = (
                f"A {self.view.phase or 'run'} phase is mid-way. Stop the engine at the next "
                "safe point and quit? The run folder can be resumed later."
            )

            def answered(yes: bool | None) -> None:
                if yes:
                    self.begin_shutdown()

            self.push_screen(ConfirmScreen(question), answered)
            return
        self.begin_shutdown()

    def begin_shutdown(self) -> None:
        self._exiting = True
        if not self.engine_running:
            self.exit(self._exit_code(), return_code=self._exit_code())
            return
        self.commands.send(Command("stop", by="tui", reason="quit from the TUI"))
        self.reviewer.close()
        self.push_screen(StoppingScreen("Stopping the engine at the next safe point…"))
        self.run_worker(self._wait_then_exit(), group="shutdown", exit_on_error=False)

    async def _wait_then_exit(self) -> None:
        deadline = time.monotonic() + self.stop_timeout
        while self.engine_running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.engine_running:
            self.engine_left_running = True
        self.flush_now()
        self.exit(self._exit_code(), return_code=self._exit_code())

    def force_exit(self) -> None:
        """Leave now, even with the engine still winding down (run_tui then ends the process)."""
        self._exiting = True
        if self.engine_running:
            self.commands.send(Command("stop", by="tui", reason="forced quit"))
            self.reviewer.close()
            self.engine_left_running = True
        self.exit(self._exit_code(), return_code=self._exit_code())

    def _exit_code(self) -> int:
        return 1 if self.engine_error else 0

    # ------------------------------------------------------------------ actions: control

    def _send(self, kind: str, reason: str = "") -> None:
        self.commands.send(Command(kind, by="tui", reason=reason))  # type: ignore[arg-type]
        self._notice("info", f"sent {kind}")

    def _refuse(self, action: str) -> None:
        self.notify(f"{action} does not apply right now.", severity="warning", markup=False)

    def action_pause(self) -> None:
        if not self.action_applies("pause"):
            return self._refuse("Pause")
        self._pause_sent = True
        self._send("pause")
        self._refresh({"status", "control"})

    def action_resume(self) -> None:
        if not self.action_applies("resume"):
            return self._refuse("Resume")
        if self.engine_running:
            self._pause_sent = False
            self._send("resume")
        else:
            self._notice("info", f"resuming run {self.run_root}")
            self.start_engine()
        self._refresh({"status", "control"})

    def action_switch(self) -> None:
        if not self.action_applies("switch"):
            return self._refuse("Switch phase")
        self._send("switch", reason=f"end the {self.view.phase} phase now")
        self._refresh({"control"})

    def action_probe(self) -> None:
        if not self.action_applies("probe"):
            return self._refuse("Probe")
        self._probe_sent = True
        self._send("probe")
        self.notify("Probe requested: it runs at the next safe point.", markup=False)
        self._refresh({"control"})

    def action_stop(self) -> None:
        if not self.action_applies("stop"):
            return self._refuse("Stop")

        def answered(yes: bool | None) -> None:
            if yes and self.action_applies("stop"):
                self._send("stop", reason="stop from the TUI")
                self.reviewer.close()
                self._refresh({"status", "control", "reviews"})

        self.push_screen(
            ConfirmScreen("Stop the run at the next safe point? It can be resumed later."),
            answered,
        )

    # ------------------------------------------------------------------ actions: review

    def _decide(self, cid: str, decision: ReviewDecision) -> None:
        if self.reviewer.decide(cid, decision):
            self._local_decisions[cid] = decision.decision
            self._live_ids.discard(cid)
            self._notice("info", f"{decision.decision} {cid}")
            self.notify(f"{cid}: {decision.decision}", title="review", markup=False)
        else:
            self.notify(
                f"{cid} is no longer waiting for a decision.", severity="warning", markup=False
            )
        self._refresh({"reviews", "status", "control"})

    def _review_target(self, action: str) -> str | None:
        cid = self._selected_review()
        if cid is None or not self.reviewer.is_waiting(cid):
            self._refuse(action)
            return None
        return cid

    def action_approve(self) -> None:
        cid = self._review_target("Approve")
        if cid:
            self._decide(cid, ReviewDecision("approve", reason="approved in review"))

    def action_pin(self) -> None:
        cid = self._review_target("Pin")
        if cid:
            self._decide(cid, ReviewDecision("pin", reason="pinned in review"))

    def action_reject(self) -> None:
        cid = self._review_target("Reject")
        if not cid:
            return

        def got_reason(reason: str | None) -> None:
            if reason:
                self._decide(cid, ReviewDecision("reject", reason=reason))

        self.push_screen(ReasonScreen(f"Reject {cid}: why?"), got_reason)

    def action_edit(self) -> None:
        cid = self._review_target("Edit")
        if not cid:
            return
        item = self.reviewer.get(cid)
        if item is None:
            return self._refuse("Edit")
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            self.notify(
                "Set $EDITOR (or $VISUAL) to edit a candidate.", severity="error", markup=False
            )
            return
        with tempfile.TemporaryDirectory(prefix="whale-lab-edit-") as tmp:
            path = Path(tmp) / f"{cid}.py"
            path.write_text(item.code, encoding="utf-8")
            try:
                rc = self._run_editor([*shlex.split(editor), str(path)])
            except (OSError, ValueError) as exc:
                self.notify(
                    f"Could not start the editor {editor!r}: {exc}", severity="error", markup=False
                )
                return
            new_code = path.read_text(encoding="utf-8")
        if rc != 0:
            self.notify(
                f"The editor exited with status {rc}; nothing was decided.",
                severity="warning",
                markup=False,
            )
            return
        if new_code == item.code:
            self.notify(
                "No changes made; approve (a) takes it as it is.", severity="warning", markup=False
            )
            return
        self._decide(cid, ReviewDecision("edit", reason="edited in review", edited_code=new_code))

    def _run_editor(self, argv: list[str]) -> int:
        guard = self.terminal_guard
        try:
            with self.suspend():
                if guard is not None:
                    with guard.terminal():
                        return subprocess.call(argv)
                return subprocess.call(argv)
        except SuspendNotSupported:
            # headless (tests): no terminal to hand over
            return subprocess.call(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )

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
    log_dir = Path(run_dir) if run_dir is not None else Path(cfg.run.directory)
    loop = asyncio.new_event_loop()
    with TerminalGuard(log_dir / "tui-output.log") as guard:
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
    return int(code or 0)
