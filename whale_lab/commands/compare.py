"""`whale-lab compare`: run schedules x seeds on one domain and print the report.

The comparison itself (run folders, skipping completed runs, the report) is
`whale_lab.engine.compare.compare_runs`; this drives each run with a progress display labelled
`[n/total schedule seed s]` and turns the outcome into an exit code: 0 done, 1 some run failed,
2 a bad request, 130 or 143 stopped by SIGINT or SIGTERM at a safe point of the run in progress,
which records the stop (running the same command again resumes); a second Ctrl-C leaves at once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from whale_lab.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    HeadlessDisplay,
    StopSignals,
    drive,
    say,
    stderr_console,
    user_error_types,
)
from whale_lab.config import Config
from whale_lab.engine.compare import CompareError, compare_runs
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore

if TYPE_CHECKING:
    from rich.console import Console

    from whale_lab.engine.engine import Engine


def compare_command(
    cfg: Config, schedules: str, seeds: str, out: str | None, *, resplit: bool = False
) -> int:
    """The command line's comma-separated `--schedules` and `--seeds`, and `--out` (default:
    `<run.directory>/compare-<domain>-<date>`)."""
    names = [x.strip() for x in schedules.split(",") if x.strip()]
    try:
        numbers = [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise CompareError(
            f"compare: --seeds must be integers separated by commas, got {seeds!r}"
        ) from None
    out_dir = out or str(
        Path(cfg.run.directory) / f"compare-{cfg.domain.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    return run_compare(cfg, names, numbers, out_dir, resplit=resplit)


def run_compare(
    cfg: Config,
    schedules: Sequence[str],
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    resplit: bool = False,
) -> int:
    """Run every schedule with every seed (sequentially), then write and print the report."""
    import sys

    console = stderr_console()
    with StopSignals(console) as signals:
        try:
            return _compare(cfg, schedules, seeds, out_dir, console, signals, resplit)
        except user_error_types() as exc:
            print(f"whale-lab: error: {exc}", file=sys.stderr)
            return EXIT_USAGE


def _compare(
    cfg: Config,
    schedules: Sequence[str],
    seeds: Sequence[int],
    out_dir: str | Path,
    console: Console,
    signals: StopSignals,
    resplit: bool = False,
) -> int:
    from whale_lab.quiet import quiet_libraries

    def drive_run(engine: Engine, commands: CommandChannel, store: RunStore, label: str) -> str:
        if signals():  # stopped between two runs: start no other
            return "stopped"
        signals.resume_at(engine.root, f"run the same compare command again ({out_dir})")
        with HeadlessDisplay(console, prefix=label) as display:
            store.subscribe(display)
            return drive(engine, commands, console, signals=signals)

    def log(text: str) -> None:
        console.print(text, markup=False, highlight=False)

    quiet_libraries()
    outcome = compare_runs(
        cfg, schedules, seeds, out_dir, drive_run=drive_run, log=log, resplit=resplit
    )
    if outcome.status != "done":
        say(console, f"stopped; run the same compare command again to resume ({outcome.folder})")
        return signals.exit_code
    if outcome.summary is not None:
        say(console, outcome.summary.read_text(encoding="utf-8"))
        say(console, f"report: {outcome.summary}")
    if outcome.failed:
        log(f"failed runs: {', '.join(outcome.failed)}")
        return EXIT_FAILED
    return EXIT_OK
