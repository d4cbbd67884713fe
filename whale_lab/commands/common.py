"""What the engine-driving commands (run, resume, probe, compare) share.

The exit codes, the rule that a user's mistake is one line on stderr, the progress display that
follows a run's events, and the signal handling every headless command shares (`StopSignals`,
`run_in_worker`, `drive`): the work runs in a worker thread so that Ctrl-C or SIGTERM can ask it
to stop at the next safe point, the stop is recorded and the run lock released before the process
exits (130 or 143), and a second Ctrl-C leaves at once. Either way the run folder stays resumable.

Exit codes: 0 done, 1 failed, 2 a user mistake (one line on stderr), 3 stopped with a candidate
awaiting review, 130 stopped on Ctrl-C (SIGINT), 143 stopped on SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
EXIT_TERMINATED = 143  # stopped on SIGTERM

T = TypeVar("T")


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
            # val is shown when it arrives: test follows only where val reached a new best
            # (eval.test_every = "best"), so a point may have no test line at all
            if ev.split == "val":
                self._val[ev.checkpoint] = ev
                self._line(
                    f"  eval (cycle {ev.cycle}, {ev.phase}): val mean@{ev.k} "
                    f"{ev.mean_at_k:.3f}  [{ev.harness}]",
                    "green",
                )
            elif ev.split == "test":
                self._val.pop(ev.checkpoint, None)
                self._line(
                    f"  eval (cycle {ev.cycle}, {ev.phase}): test mean@{ev.k} "
                    f"{ev.mean_at_k:.3f} (a new best on val)",
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
            if ev.status == "failed":
                return  # the exception that failed it reaches the command: one line, said there
            msg = f": {ev.message}" if ev.message else ""
            self._line(f"run {ev.status}{msg}", "bold")


class StopSignals:
    """SIGINT and SIGTERM ask for a stop at the next safe point; a second SIGINT leaves at once.

    Used as a context manager around a whole command, model loading included. `__call__` is a
    `should_stop`; `watch` hands the request to an engine's command channel. The handlers never
    raise: on CPython 3.11 an exception (Ctrl-C's KeyboardInterrupt) that interrupts
    `Thread.join()` marks the thread as finished while it still runs (`_wait_for_tstate_lock`
    releases the lock the running thread holds), so a driver that caught it went on to
    interpreter shutdown under an engine thread still inside torch; the interpreter ends such a
    thread with `pthread_exit`, whose unwinding through torch's C++ frames ends in
    `std::terminate` ("terminate called without an active exception", exit 134), with the stop
    never recorded and `engine.lock` left behind.
    """

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or stderr_console()
        self.signum = 0  # the first signal received (0: none)
        self.root: Path | None = None  # the run folder: its lock is released on leaving
        self.resume_hint = ""  # how to continue ("resume with: ..."), printed on leaving
        self._watchers: list[Callable[[str], None]] = []
        self._old: dict[int, Any] = {}
        self._done = False  # the command has returned

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._done = True
        if not self.signum:
            self.restore()
        # Stopping: the handlers stay until the process ends, so that a second Ctrl-C that comes
        # late exits 130 here rather than as a KeyboardInterrupt in interpreter shutdown.

    def restore(self) -> None:
        """Put back the handlers that were there before."""
        for sig, old in self._old.items():
            signal.signal(sig, old)
        self._old.clear()

    def __call__(self) -> bool:
        return self.signum != 0

    @property
    def exit_code(self) -> int:
        """130 after SIGINT, 143 after SIGTERM (128 + the signal, as a shell reports it)."""
        return EXIT_TERMINATED if self.signum == signal.SIGTERM else EXIT_STOPPED

    def reason(self) -> str:
        return "SIGTERM" if self.signum == signal.SIGTERM else "Ctrl-C"

    def resume_at(self, root: str | Path, hint: str = "") -> None:
        """The run folder now in use, and how to continue it (default: `whale-lab resume`)."""
        self.root = Path(root)
        self.resume_hint = hint or f"resume with: whale-lab resume {root}"

    @contextlib.contextmanager
    def watch(self, on_stop: Callable[[str], None]) -> Iterator[None]:
        """Call `on_stop(reason)` on a stop request while inside (at once if one came already)."""
        self._watchers.append(on_stop)
        try:
            if self.signum:
                on_stop(self.reason())
            yield
        finally:
            self._watchers.remove(on_stop)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.signum:
            self.signum = signum
            self._say(
                "stopping at the next safe point (Ctrl-C again leaves now; the run folder "
                "stays resumable)"
            )
            for on_stop in list(self._watchers):
                on_stop(self.reason())
        elif signum == signal.SIGINT and self._done:  # the stop is recorded: just go
            _exit_now(self.exit_code)
        elif signum == signal.SIGINT:
            leave_now(self.console, self.root, self.resume_hint)
        # a second SIGTERM: the stop asked for by the first is under way

    def _say(self, text: str) -> None:
        try:
            say(self.console, text)
        except Exception:  # noqa: BLE001 - a handler must not fail over a message
            pass


def run_in_worker(work: Callable[[], T], name: str = "whale-lab-work") -> T:
    """`work()` in a thread while this thread waits, so that signal handlers run at once.

    The wait ends only when the work has returned (handlers never raise; see `StopSignals`), and
    the thread is not a daemon, so the interpreter never shuts down under it. The work's
    exception is raised here.
    """
    done = threading.Event()
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc
        finally:
            done.set()

    worker = threading.Thread(target=target, name=name)
    worker.start()
    while not done.wait(0.25):
        pass
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def drive(
    engine: Engine,
    commands: CommandChannel,
    console: Console,
    on_interrupt: Callable[[], None] | None = None,
    *,
    signals: StopSignals | None = None,
) -> str:
    """Run the engine in a worker thread; SIGINT/SIGTERM -> stop at a safe point. Returns "done"
    (finished by itself) or "stopped" (stopped on request); a second Ctrl-C leaves the process.

    `signals` is the command's own (so a signal during its start-up counts too); without one the
    handlers are installed here for the run.
    """
    own = signals is None
    sig = signals if signals is not None else StopSignals(console)
    if sig.root != Path(engine.root):
        sig.resume_at(engine.root)

    def ask_stop(reason: str) -> None:
        commands.send(Command("stop", by="signal" if reason == "SIGTERM" else "keyboard",
                              reason=reason))
        if on_interrupt is not None:
            on_interrupt()

    with contextlib.ExitStack() as stack:
        if own:
            stack.enter_context(sig)
        stack.enter_context(sig.watch(ask_stop))
        run_in_worker(engine.run, name="whale-lab-engine")
    return "stopped" if sig() else "done"


def leave_now(console: Console, root: str | Path | None, hint: str = "") -> None:
    """A second Ctrl-C: end the process at once, without waiting for the work.

    `os._exit` skips interpreter shutdown, which would abort under a thread inside torch. The
    run folder's files are all written atomically, so the run resumes from its last completed
    step (`hint`, default "resume with: whale-lab resume ROOT"); the folder's lock is released
    so that the resume can take it.
    """
    try:
        if root is not None:
            from whale_lab.engine import runlock

            runlock.release(Path(root))
            say(console, f"left without waiting; {hint or f'resume with: whale-lab resume {root}'}")
        else:
            say(console, "left without waiting")
    except BaseException:  # noqa: BLE001, S110 - leaving is what matters now
        pass
    _exit_now(EXIT_STOPPED)


def _exit_now(code: int) -> None:
    """Flush what was printed and end the process without interpreter shutdown."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001, S110 - a closed or busy stream
            pass
    os._exit(code)
