"""`whale-lab probe`: which component limits the agent now, the harness or the weights?

On a run folder (its current weights and accepted harness), or on a new run from the config (base
weights, h0). The probe itself is the engine's (`Engine.probe_now`); this prints its table.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from whale_lab.commands.common import (
    EXIT_OK,
    EXIT_STOPPED,
    HeadlessDisplay,
    guard,
    say,
    stderr_console,
)
from whale_lab.config import Config
from whale_lab.engine.headless import headless_config
from whale_lab.events import ProbeResult
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import CommandChannel

if TYPE_CHECKING:
    from rich.console import Console


def run_probe(cfg: Config, run_dir: str | Path | None = None, keep: bool | str = False) -> int:
    """Probe `run_dir` (or a new run); returns 0 when the probe finished, 130 when it did not.

    `keep` False leaves the run as it was; True keeps the side that gained more (if it gained);
    "weights", "harness" or "both" keep those.
    """
    console = stderr_console()

    def go() -> int:
        from whale_lab.engine.engine import EngineError, open_engine
        from whale_lab.engine.probe import KEEP_MODES
        from whale_lab.quiet import quiet_libraries

        mode = "best" if keep is True else "none" if keep is False else str(keep)
        if mode not in KEEP_MODES:
            raise EngineError(f"--keep: expected one of {', '.join(KEEP_MODES)}, got {keep!r}")
        quiet_libraries()
        engine, store = open_engine(
            headless_config(cfg), run_dir, reviewer=AutoReviewer(), commands=CommandChannel()
        )
        try:
            with HeadlessDisplay(console) as display:
                store.subscribe(display)
                result = engine.probe_now(dataclasses.replace(engine.probe_settings, keep=mode))
            if result is None:
                console.print("the probe did not finish", markup=False)
                return EXIT_STOPPED
            _print_probe(console, result)
            say(console, f"run folder: {store.root}")
            return EXIT_OK
        finally:
            store.close()

    return guard(go)


def _print_probe(console: Console, result: ProbeResult) -> None:
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
    say(console, result.recommendation)
