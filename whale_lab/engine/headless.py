"""Entry points for the command line without the TUI: run, resume, probe.

`run_headless` runs the configured schedule with a rich progress display and the approval mode
`approval.headless_mode` (auto by default: nobody is there to review). The engine runs in a worker
thread; Ctrl-C (or SIGTERM) asks it to stop at the next safe point, a second Ctrl-C leaves at once.
Either way the run folder stays resumable with `whale-lab resume RUN`.

Exit codes: 0 done, 1 failed, 2 a user mistake (one line on stderr), 3 stopped with a candidate
awaiting review, 130 stopped on request.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale_lab.config import Config
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
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import Command, CommandChannel, Reviewer

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_PENDING, EXIT_STOPPED = 0, 1, 2, 3, 130


def user_error_types() -> tuple[type[BaseException], ...]:
    """Errors caused by a user's input or environment: one line, no traceback."""
    from whale_lab.errors import WhaleLabError

    return (WhaleLabError, FileNotFoundError)


# ---------------------------------------------------------------------------- display


class HeadlessDisplay:
    """A store listener: one line per phase, evaluation, acceptance, command and probe, and a
    progress bar for the current phase when the output is a terminal."""

    def __init__(self, console: Any = None, *, prefix: str = "", live: bool | None = None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console or Console(stderr=True, highlight=False)
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


def print_result(console: Any, root: str | Path) -> None:
    """The val-selected result, the best-on-test figure (marked), and the ledger."""
    from rich.table import Table

    from whale_lab.engine.ledger import Ledger
    from whale_lab.store import read_json

    root = Path(root)
    result = read_json(root / "result.json", {}) or {}
    state = read_json(root / "state.json", {}) or {}
    best = result.get("best") or state.get("best") or {}
    table = Table(title=f"result of {root.name}", show_header=True)
    table.add_column("")
    table.add_column("val mean@k", justify="right")
    table.add_column("test mean@k", justify="right")
    table.add_column("checkpoint")

    def num(v: Any) -> str:
        return "-" if v is None else f"{100 * float(v):.2f}%"

    if best:
        table.add_row(
            "selected on val",
            num(best.get("val")),
            num(best.get("test")),
            str(best.get("checkpoint", "")),
        )
        table.add_row(
            "best on test *",
            "",
            num(best.get("best_on_test")),
            str(best.get("best_on_test_checkpoint", "")),
        )
        console.print(table)
        console.print(
            "reported: the test score of the checkpoint selected on val.\n"
            "* the paper's way (selected on test), shown for comparison only.",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        console.print(
            f"harness: {best.get('harness', '')}\nweights: {best.get('weights', '')}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    for line in Ledger.read(root).summary_lines():
        console.print(line, markup=False, highlight=False)
    console.print(f"run folder: {root}", markup=False, highlight=False, soft_wrap=True)


# ---------------------------------------------------------------------------- driving


def drive(
    engine: Any,
    commands: CommandChannel,
    console: Any,
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


def leave_now(console: Any, root: str | Path) -> None:
    """A second Ctrl-C: end the process at once. The engine thread may be inside torch, where
    interpreter shutdown would abort; every file in the run folder is written atomically, so
    the run resumes from its last completed step."""
    import os

    console.print(
        f"left without waiting; resume with: whale-lab resume {root}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_STOPPED)


def headless_config(cfg: Config) -> Config:
    """The config with `approval.mode` set to `approval.headless_mode`."""
    return cfg.replace(approval=dataclasses.replace(cfg.approval, mode=cfg.approval.headless_mode))


def _reviewer_for(cfg: Config) -> Reviewer:
    """Manual approval headless needs a terminal; the other modes never ask anyone."""
    if cfg.approval.mode != "manual":
        return AutoReviewer()
    if not sys.stdin.isatty():
        from whale_lab.engine.engine import EngineError

        raise EngineError(
            'approval.headless_mode = "manual" needs a terminal to answer reviews; '
            'set it to "auto" or "threshold", or use the TUI'
        )
    from whale_lab.reviewers import TerminalReviewer

    return TerminalReviewer()


def _exit_code(engine: Any, how: str) -> int:
    status = engine.state.get("status")
    if how == "left":
        return EXIT_STOPPED
    if status == "completed":
        return EXIT_OK
    if status == "failed":
        return EXIT_FAILED
    if "awaits review" in str(engine.state.get("message", "")):
        return EXIT_PENDING
    return EXIT_STOPPED


def _run_engine(cfg: Config, run_dir: str | Path | None, console: Any) -> int:
    from whale_lab.engine.engine import open_engine
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    commands = CommandChannel()
    reviewer = _reviewer_for(cfg)
    engine, store = open_engine(cfg, run_dir, reviewer=reviewer, commands=commands)
    try:
        if engine.state.get("status") == "completed":
            console.print(f"{store.root} has already completed.", markup=False, highlight=False)
            print_result(console, store.root)
            return EXIT_OK
        with HeadlessDisplay(console) as display:
            store.subscribe(display)
            how = drive(engine, commands, console)
        if how == "left":
            leave_now(console, store.root)
        code = _exit_code(engine, how)
        if code == EXIT_OK:
            print_result(console, store.root)
        elif code in (EXIT_PENDING, EXIT_STOPPED):
            console.print(
                f"resume with: whale-lab resume {store.root}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
        return code
    finally:
        store.close()


def _guard(fn: Callable[[], int]) -> int:
    """User mistakes become one line on stderr and exit code 2."""
    try:
        return fn()
    except user_error_types() as exc:
        print(f"whale-lab: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def run_headless(cfg: Config, run_dir: str | Path | None = None) -> int:
    """`whale-lab run --headless`: the configured schedule, a new run (or `run_dir` resumed)."""
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    return _guard(lambda: _run_engine(headless_config(cfg), run_dir, console))


def run_resume(run_dir: str | Path, *, headless: bool = True) -> int:
    """`whale-lab resume RUN`: continue a run from its folder (its own config.json wins)."""
    from rich.console import Console

    from whale_lab.engine.engine import load_run_config

    console = Console(stderr=True, highlight=False)

    def go() -> int:
        cfg = load_run_config(run_dir)
        if not headless:
            from whale_lab.tui.app import run_tui

            return run_tui(cfg, run_dir=str(run_dir))
        return _run_engine(headless_config(cfg), run_dir, console)

    return _guard(go)


def run_probe(cfg: Config, run_dir: str | Path | None = None, keep: bool | str = False) -> int:
    """`whale-lab probe`: which component limits the agent now? On a run folder (its current
    weights and accepted harness), or on a new run from the config (base weights, h0).

    `keep` False leaves the run as it was; True keeps the side that gained more (if it gained);
    "weights", "harness" or "both" keep those.
    """
    from rich.console import Console

    from whale_lab.engine.engine import open_engine
    from whale_lab.engine.probe import KEEP_MODES
    from whale_lab.quiet import quiet_libraries

    console = Console(stderr=True, highlight=False)

    def go() -> int:
        mode = "best" if keep is True else "none" if keep is False else str(keep)
        if mode not in KEEP_MODES:
            from whale_lab.engine.engine import EngineError

            raise EngineError(f"--keep: expected one of {', '.join(KEEP_MODES)}, got {keep!r}")
        quiet_libraries()
        run_cfg = headless_config(cfg)
        engine, store = open_engine(
            run_cfg, run_dir, reviewer=AutoReviewer(), commands=CommandChannel()
        )
        try:
            with HeadlessDisplay(console) as display:
                store.subscribe(display)
                result = engine.probe_now(dataclasses.replace(engine.probe_settings, keep=mode))
            if result is None:
                console.print("the probe did not finish", markup=False)
                return EXIT_STOPPED
            _print_probe(console, result)
            console.print(
                f"run folder: {store.root}", markup=False, highlight=False, soft_wrap=True
            )
            return EXIT_OK
        finally:
            store.close()

    return _guard(go)


def _print_probe(console: Any, result: Any) -> None:
    from rich.table import Table

    d = result.diagnostics
    table = Table(title="bottleneck probe", show_header=True)
    table.add_column("side")
    table.add_column("val mean@k after", justify="right")
    table.add_column("rollouts", justify="right")
    table.add_column("gain per 1,000 rollouts", justify="right")
    before = d.get("val_mean_at_k_before", 0.0)
    table.add_row("now", f"{before:.3f}", "", "")
    for side, key, rollouts, gain in (
        (
            "harness probe",
            "val_mean_at_k_after_harness_probe",
            "harness_probe_rollouts",
            result.harness_gain_per_1k,
        ),
        (
            "weight probe",
            "val_mean_at_k_after_weight_probe",
            "weight_probe_rollouts",
            result.weight_gain_per_1k,
        ),
    ):
        after = d.get(key)
        table.add_row(
            side,
            "-" if after is None else f"{after:.3f}",
            f"{int(d.get(rollouts, 0)):,}",
            f"{gain:+.4f}",
        )
    console.print(table)
    console.print(result.recommendation, markup=False, highlight=False, soft_wrap=True)
