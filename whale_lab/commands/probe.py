"""`whale-lab probe`: which component limits the agent now, the harness or the weights?

On a run folder (its current weights and accepted harness), or on a new run from the config (base
weights, h0). The probe itself is the engine's (`Engine.probe_now`); this prints its table.
Ctrl-C or SIGTERM abandons the probe at its next safe point (recorded as a stopped run; exit 130 or
143), a second Ctrl-C leaves at once.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.commands.common import (
    EXIT_OK,
    HeadlessDisplay,
    StopSignals,
    guard,
    run_in_worker,
    say,
    stderr_console,
)
from whale_lab.config import Config
from whale_lab.engine.headless import headless_config
from whale_lab.events import ProbeResult
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import Command, CommandChannel

if TYPE_CHECKING:
    from rich.console import Console


def run_probe(
    cfg: Config,
    run_dir: str | Path | None = None,
    keep: bool | str = False,
    *,
    as_json: bool = False,
) -> int:
    """Probe `run_dir` (or a new run); returns 0 when the probe finished, 130/143 when SIGINT or
    SIGTERM stopped it.

    `keep` False leaves the run as it was; True ("best") keeps the side whose paired gain
    interval excludes zero on at least 5 val tasks (both: the higher low end), else the incumbent,
    and says which; "weights", "harness" or "both" keep those.
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
        commands = CommandChannel()
        engine, store = open_engine(
            headless_config(cfg), run_dir, reviewer=AutoReviewer(), commands=commands
        )
        signals.resume_at(store.root, f"probe again with: whale-lab probe --run {store.root}")

        def stop(reason: str) -> None:
            commands.send(Command("stop", by="signal", reason=reason))

        try:
            settings = dataclasses.replace(engine.probe_settings, keep=mode)
            with HeadlessDisplay(console) as display, signals.watch(stop):
                store.subscribe(display)
                result = run_in_worker(lambda: engine.probe_now(settings))
            if result is None:
                say(console, f"the probe did not finish; {signals.resume_hint}")
                return signals.exit_code
            if as_json:
                print(json.dumps(_probe_json(result, store.root), indent=2))
                return EXIT_OK
            _print_probe(console, result)
            say(console, f"run folder: {store.root}")
            return EXIT_OK
        finally:
            store.close()

    with StopSignals(console) as signals:
        return guard(go)


def _interval_text(interval: Any) -> str:
    if not interval:
        return "-"
    return f"[{interval[0]:+.4f}, {interval[1]:+.4f}]"


def _keep_note(result: ProbeResult) -> str:
    from whale_lab.engine.probe import KEEP_NOTE_PREFIX

    return next((e for e in result.evidence if e.startswith(KEEP_NOTE_PREFIX)), "")


def _probe_json(result: ProbeResult, root: Path) -> dict[str, Any]:
    """What a script needs: the verdict, and per side its gain, interval ([low, high]), verdict
    and, where inconclusive, the paired val tasks and tasks x k rollouts that would resolve it."""
    return {
        "verdict": result.verdict,
        "recommendation": result.recommendation,
        "harness": result.sides.get("harness", {}),
        "weights": result.sides.get("weights", {}),
        "val_before": result.diagnostics.get("val_mean_at_k_before"),
        "keep_note": _keep_note(result),
        "evidence": list(result.evidence),
        "run_dir": str(root),
    }


def _print_probe(console: Console, result: ProbeResult) -> None:
    from rich.table import Table

    d = result.diagnostics
    table = Table(title="bottleneck probe", show_header=True)
    table.add_column("side")
    table.add_column("val mean@k after", justify="right")
    table.add_column("rollouts", justify="right")
    table.add_column("gain per 1,000 rollouts", justify="right")
    table.add_column("95% interval (paired)", justify="right")
    table.add_column("verdict")
    before = d.get("val_mean_at_k_before", 0.0)
    table.add_row("now", f"{before:.3f}", "", "")
    for side, key, rollouts, gain, name in (
        (
            "harness probe",
            "val_mean_at_k_after_harness_probe",
            "harness_probe_rollouts",
            result.harness_gain_per_1k,
            "harness",
        ),
        (
            "weight probe",
            "val_mean_at_k_after_weight_probe",
            "weight_probe_rollouts",
            result.weight_gain_per_1k,
            "weights",
        ),
    ):
        after = d.get(key)
        table.add_row(
            side,
            "-" if after is None else f"{after:.3f}",
            f"{int(d.get(rollouts, 0)):,}",
            f"{gain:+.4f}",
            _interval_text(result.sides.get(name, {}).get("interval")),
            str(result.sides.get(name, {}).get("verdict", "")),
        )
    console.print(table)
    say(console, result.recommendation)
    note = _keep_note(result)
    if note:
        say(console, note)


def run_interaction_probe(cfg: Config, run_dir: str | Path | None, *, as_json: bool = False) -> int:
    """`whale-lab probe --interaction --run RUN`: the 2 x 2 harness x weights probe on a run with
    an ended weight phase and an ended harness phase; 0 when it finished, 130/143 when stopped."""
    console = stderr_console()

    def go() -> int:
        from whale_lab.engine.engine import EngineError, open_engine
        from whale_lab.engine.interaction import InteractionStopped, run_interaction
        from whale_lab.quiet import quiet_libraries

        if run_dir is None:
            raise EngineError("--interaction probes an existing run: give it with --run RUN")
        quiet_libraries()
        engine, store = open_engine(
            headless_config(cfg), run_dir, reviewer=AutoReviewer(), commands=CommandChannel()
        )
        signals.resume_at(
            store.root, f"probe again with: whale-lab probe --interaction --run {store.root}"
        )
        try:
            with HeadlessDisplay(console) as display:
                store.subscribe(display)
                try:
                    out = run_in_worker(lambda: run_interaction(engine, should_stop=signals))
                except InteractionStopped:
                    say(console, f"the interaction probe did not finish; {signals.resume_hint}")
                    return signals.exit_code
            if as_json:
                print(json.dumps({**out, "run_dir": str(store.root)}, indent=2))
                return EXIT_OK
            _print_interaction(console, out)
            say(console, f"run folder: {store.root}")
            return EXIT_OK
        finally:
            try:
                engine.ctx.backend.close()
            finally:
                store.close()

    with StopSignals(console) as signals:
        return guard(go)


def _print_interaction(console: Console, out: dict[str, Any]) -> None:
    from rich.table import Table

    cells = out["cells"]
    steps = out["steps"]
    table = Table(title="interaction probe (val mean@k)", show_header=True)
    table.add_column("harness")
    table.add_column(f"weights before (step {steps[0]})", justify="right")
    table.add_column(f"weights after (step {steps[1]})", justify="right")
    table.add_row(
        f"incumbent {out['incumbent']}",
        f"{cells['incumbent/before']:.3f}",
        f"{cells['incumbent/after']:.3f}",
    )
    table.add_row(
        f"candidate {out['candidate']}",
        f"{cells['candidate/before']:.3f}",
        f"{cells['candidate/after']:.3f}",
    )
    before, after = out["gain_before"], out["gain_after"]
    table.add_row(
        "harness gain (paired)",
        f"{before['diff']:+.3f} {_interval_text(before['interval'])}",
        f"{after['diff']:+.3f} {_interval_text(after['interval'])}",
    )
    console.print(table)
    say(console, out["text"])
