"""`whale-lab run --headless` and `whale-lab resume RUN --headless`: a run without the app.

The configured schedule runs with a progress display and the approval mode
`approval.headless_mode` (auto by default: nobody is there to review). Ctrl-C (or SIGTERM) asks
the engine to stop at the next safe point, where it records the stop and releases the run's lock
(exit 130, or 143 for SIGTERM); a second Ctrl-C leaves at once. Either way the run folder stays
resumable with `whale-lab resume RUN`. Exit codes: see `commands.common`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PENDING,
    HeadlessDisplay,
    StopSignals,
    drive,
    guard,
    say,
    stderr_console,
)
from whale_lab.config import Config
from whale_lab.engine.headless import headless_config
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import CommandChannel, Reviewer

if TYPE_CHECKING:
    from rich.console import Console

    from whale_lab.engine.engine import Engine


def run_headless(cfg: Config, run_dir: str | Path | None = None) -> int:
    """`whale-lab run --headless`: the configured schedule, a new run (or `run_dir` resumed)."""
    console = stderr_console()
    with StopSignals(console) as signals:
        return guard(lambda: _run_engine(headless_config(cfg), run_dir, console, signals))


def run_resume(run_dir: str | Path) -> int:
    """`whale-lab resume RUN --headless`: continue a run from its folder (its own config.json
    wins)."""
    from whale_lab.engine.engine import load_run_config

    console = stderr_console()
    with StopSignals(console) as signals:
        return guard(
            lambda: _run_engine(
                headless_config(load_run_config(run_dir)), run_dir, console, signals
            )
        )


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


def _exit_code(engine: Engine, signals: StopSignals) -> int:
    status = engine.state.status
    if status == "completed":
        return EXIT_OK
    if status == "failed":
        return EXIT_FAILED
    if "awaits review" in str(engine.state.message):
        return EXIT_PENDING
    return signals.exit_code


def _run_engine(
    cfg: Config, run_dir: str | Path | None, console: Console, signals: StopSignals
) -> int:
    from whale_lab.engine.engine import open_engine
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    commands = CommandChannel()
    reviewer = _reviewer_for(cfg)
    engine, store = open_engine(cfg, run_dir, reviewer=reviewer, commands=commands)
    try:
        if engine.state.status == "completed":
            console.print(f"{store.root} has already completed.", markup=False, highlight=False)
            print_result(console, store.root)
            return EXIT_OK
        signals.resume_at(store.root)
        with HeadlessDisplay(console) as display:
            store.subscribe(display)
            drive(engine, commands, console, signals=signals)
        code = _exit_code(engine, signals)
        if code == EXIT_OK:
            print_result(console, store.root)
        elif code != EXIT_FAILED:
            say(console, f"resume with: whale-lab resume {store.root}")
        return code
    finally:
        store.close()


def print_result(console: Console, root: str | Path) -> None:
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
        say(
            console,
            "reported: the test score of the checkpoint selected on val.\n"
            "* the paper's way (selected on test), shown for comparison only.",
        )
        say(console, f"harness: {best.get('harness', '')}\nweights: {best.get('weights', '')}")
    for line in Ledger.read(root).summary_lines():
        console.print(line, markup=False, highlight=False)
    say(console, f"run folder: {root}")
