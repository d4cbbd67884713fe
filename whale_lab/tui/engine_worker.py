"""The engine in a thread worker: starting (or resuming) it, hearing how it ended, stopping it.

The engine reaches the UI only through the app's inbox (events from `RunStore` listeners) and
`post_message`; commands go back through a `CommandChannel`. The engine itself is imported inside
the worker, so the TUI never loads torch, transformers, peft or vllm.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.message import Message
from textual.worker import Worker, WorkerState

from whale_lab.config import Config
from whale_lab.events import Event
from whale_lab.quiet import quiet_libraries
from whale_lab.reviewers import ThreadReviewer
from whale_lab.seams import Command, CommandChannel
from whale_lab.threads import configure as configure_threads
from whale_lab.tui.review_queue import ReviewQueue
from whale_lab.tui.screens import StoppingScreen
from whale_lab.tui.state import RunView

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[int]
else:
    _AppBase = object

EngineFactory = Callable[[Config, "str | None", ThreadReviewer, CommandChannel], tuple[Any, Any]]


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


class EngineWorker(_AppBase):
    """Runs the engine in the background and winds it down on quit (a `WhaleLabApp` mixin)."""

    cfg: Config
    run_dir: str | None
    run_root: Path | None
    engine_factory: EngineFactory
    stop_timeout: float
    view: RunView
    commands: CommandChannel
    reviewer: ThreadReviewer
    reviews: ReviewQueue
    engine_left_running: bool
    engine_error: str
    _inbox: deque[Event]
    _engine_worker: Worker[Any] | None
    _engine_started: bool
    _exiting: bool
    _starts_at_launch: int

    if TYPE_CHECKING:

        def flush_now(self) -> None: ...

        def _flush_events(self) -> None: ...

        def _refresh_all(self) -> None: ...

        def _notice(self, level: str, message: str) -> None: ...

        def _forget_sent(self) -> None: ...

        def _on_review_request(self, item: object) -> None: ...

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
            self.reviews.attach(self.reviewer)
        self._engine_started = True
        configure_threads(lambda message: self._notice("info", message))  # before torch loads
        self._forget_sent()
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
        guard = getattr(self, "terminal_guard", None)
        if guard is not None:
            guard.move_log(message.root / "tui-output.log")

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

    # ------------------------------------------------------------------ shutdown

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
