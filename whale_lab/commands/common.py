"""What the engine-driving commands (run, resume, probe, compare) share.

The exit codes, the rule that a user's mistake is one line on stderr, the progress display that
follows a run's events, and the driver that runs the engine in a worker thread so that Ctrl-C or
SIGTERM can ask it to stop at the next safe point (a second Ctrl-C leaves at once). Either way the
run folder stays resumable with `whale-lab resume RUN`.

Exit codes: 0 done, 1 failed, 2 a user mistake (one line on stderr), 3 stopped with a candidate
awaiting review, 130 stopped on request.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.events import (
    CommandReceived,
    EpisodeFinished,
    EvalResult,
    Event,
    HarnessAccepted,
    Log,
    PhaseEnded,
    PhaseProgress,
    PhaseStarted,
    ProbeResult,
    RunFinished,
    RunStarted,
)
from whale_lab.seams import Command, CommandChannel

if TYPE_CHECKING:
    from rich.console import Console

    from whale_lab.engine.engine import Engine

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PENDING, EXIT_STOPPED = 0, 1, 2, 3, 130


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors caused by a user's input or environment: one line, no traceback."""
    from whale_lab.errors import WhaleLabError

    return (WhaleLabError, FileNotFoundError)


def guard(fn: Callable[[], int]) -> int:
    """User mistakes become one line on stderr and exit code 2."""
    try:
        return fn()
    except user_error_types() as exc:
        print(f"whale-lab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def stderr_console() -> Console:
    """The console progress and notes go to (stdout is kept for results)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def say(console: Console, text: str) -> None:
    """One plain line: no markup, no highlighting, long paths kept whole."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


class HeadlessDisplay:
    """A store listener: one line per phase, evaluation, acceptance, command and probe, and a
    progress bar for the current phase when the output is a terminal."""

    def __init__(
        self, console: Console | None = None, *, prefix: str = "", live: bool | None = None
    ) -> None:
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console or stderr_console()
        self.prefix = prefix
        self.live = self.console.is_terminal if live is None else live
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[episodes]} episodes"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.live,
            transient=True,
        )
        self._task: Any = None
        self._episodes = 0
        self._val: dict[str, EvalResult] = {}
        self._lock = threading.Lock()
        self._started = False

    def __enter__(self) -> HeadlessDisplay:
        self.progress.start()
        self._started = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._started:
            self.progress.stop()
            self._started = False

    def _line(self, text: str, style: str = "") -> None:
        self.console.print(
            f"{self.prefix}{text}",
            style=style or None,
            markup=False,
            highlight=False,
            soft_wrap=True,
        )

    def __call__(self, ev: Event) -> None:
        with self._lock:
            self._show(ev)

    def _show(self, ev: Event) -> None:
        if isinstance(ev, EpisodeFinished):
            self._episodes += 1
            if self._task is not None and self._episodes % 8 == 0:
                self.progress.update(self._task, episodes=self._episodes)
            return
        if isinstance(ev, RunStarted):
            verb = "resumed" if ev.resumed else "started"
            self._line(
                f"run {ev.run_id} {verb}: {ev.schedule} on {ev.domain}, model "
                f"{ev.model}, harness {ev.harness}",
                "bold",
            )
        elif isinstance(ev, PhaseStarted):
            if self._task is not None:
                self.progress.remove_task(self._task)
            self._episodes = 0
            self._task = self.progress.add_task(
                f"{self.prefix}cycle {ev.cycle} {ev.phase}", total=max(ev.budget, 1e-9), episodes=0
            )
            self._line(
                f"cycle {ev.cycle}: {ev.phase} phase ({ev.budget:g} {ev.budget_unit}) "
                f"under {ev.harness}",
                "cyan",
            )
        elif isinstance(ev, PhaseProgress):
            if self._task is not None:
                self.progress.update(
                    self._task,
                    completed=ev.done,
                    total=max(ev.budget, 1e-9),
                    episodes=self._episodes,
                )
        elif isinstance(ev, PhaseEnded):
            if self._task is not None:
                self.progress.remove_task(self._task)
                self._task = None
            self._line(
                f"cycle {ev.cycle}: {ev.phase} phase ended ({ev.reason}); rollouts so "
                f"far: weight {ev.weight_rollouts:,}, harness {ev.harness_rollouts:,}"
            )
        elif isinstance(ev, EvalResult):
            if ev.split == "val":
                self._val[ev.checkpoint] = ev
            elif ev.split == "test":
                val = self._val.pop(ev.checkpoint, None)
                v = f"{val.mean_at_k:.3f}" if val else "-"
                self._line(
                    f"  eval (cycle {ev.cycle}, {ev.phase}): val mean@{ev.k} {v}, test "
                    f"{ev.mean_at_k:.3f}  [{ev.harness}]",
                    "green",
                )
        elif isinstance(ev, HarnessAccepted):
            pin = " (pinned)" if ev.pinned else ""
            self._line(
                f"  harness accepted{pin}: {ev.candidate_id}, success "
                f"{ev.success_rate:.1%} on the harness split"
            )
        elif isinstance(ev, CommandReceived):
            why = f": {ev.reason}" if ev.reason else ""
            self._line(f"command {ev.command} from {ev.by}{why}", "yellow")
        elif isinstance(ev, ProbeResult):
            self._line(f"probe: {ev.recommendation}", "bold magenta")
            for line in ev.evidence:
                self._line(f"  - {line}")
        elif isinstance(ev, Log):
            if ev.level in ("warning", "error"):
                self._line(f"{ev.level}: {ev.message}", "red" if ev.level == "error" else "yellow")
        elif isinstance(ev, RunFinished):
            if self._task is not None:
                self.progress.remove_task(self._task)
                self._task = None
            msg = f": {ev.message}" if ev.message else ""
            self._line(f"run {ev.status}{msg}", "bold")


def drive(
    engine: Engine,
    commands: CommandChannel,
    console: Console,
    on_interrupt: Callable[[], None] | None = None,
) -> str:
    """Run the engine in a worker thread; Ctrl-C/SIGTERM -> stop at a safe point. Returns
    "done" (finished by itself), "stopped" (stopped on request) or "left" (second Ctrl-C)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            engine.run()
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    worker = threading.Thread(target=target, name="whale-lab-engine", daemon=True)
    asked = threading.Event()

    def ask_stop(reason: str, by: str = "keyboard") -> None:
        if not asked.is_set():
            asked.set()
            commands.send(Command("stop", by=by, reason=reason))
            console.print(
                "stopping at the next safe point (Ctrl-C again leaves now; the run "
                "folder stays resumable)",
                markup=False,
                highlight=False,
            )
            if on_interrupt is not None:
                on_interrupt()

    previous: Any = None
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        previous = signal.signal(signal.SIGTERM, lambda *_: ask_stop("SIGTERM", "signal"))
    worker.start()
    try:
        try:
            while worker.is_alive():
                worker.join(0.2)
        except KeyboardInterrupt:
            ask_stop("Ctrl-C")
            try:
                while worker.is_alive():
                    worker.join(0.2)
            except KeyboardInterrupt:
                return "left"
    finally:
        if in_main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if errors:
        raise errors[0]
    return "stopped" if asked.is_set() else "done"


def leave_now(console: Console, root: str | Path) -> None:
    """A second Ctrl-C: end the process at once. The engine thread may be inside torch, where
    interpreter shutdown would abort; every file in the run folder is written atomically, so
    the run resumes from its last completed step."""
    import os

    say(console, f"left without waiting; resume with: whale-lab resume {root}")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOPPED)
