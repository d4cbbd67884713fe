"""`whale-lab eval`: score a harness on a split and print mean@k, pass@k and the diagnostics.

Scoring is the run's `Evaluator` (sandbox, context limit and wave size from the config); each
episode's trace goes through an `EpisodeSink` into `traces/eval-<split>.jsonl` of a new run
folder, next to `eval.json` with the result. Ctrl-C or SIGTERM stops between turns: the episodes
finished so far stay in the traces, the stop is recorded as a `run_finished` event, no `eval.json`
is written (a partial score would read as a result), and the exit code is 130 or 143.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from whale_lab.commands.common import StopSignals, run_in_worker
from whale_lab.config import Config
from whale_lab.engine.runs import from_cwd
from whale_lab.events import RunFinished
from whale_lab.trace import EpisodeTrace

#: The version of `eval.json` and of `eval --json`'s object; raised when a key changes meaning
#: or goes away (new keys keep it). Paths in it are relative to the working directory.
EVAL_SCHEMA = 1


def run_eval(
    cfg: Config,
    *,
    harness: str | None,
    split: str,
    k: int | None,
    as_json: bool,
    limit: int | None = None,
    progress: bool = True,
) -> int:
    """Score `harness` (default: the domain's) on `split`, keep the traces; 0, 2 when the
    harness file is missing, 130/143 when stopped by SIGINT/SIGTERM."""
    from rich.console import Console

    console = Console(stderr=True)
    with StopSignals(console) as signals:
        return _eval(cfg, harness, split, k, as_json, limit, progress, console, signals)


def _eval(
    cfg: Config,
    harness: str | None,
    split: str,
    k: int | None,
    as_json: bool,
    limit: int | None,
    progress: bool,
    console: Any,
    signals: StopSignals,
) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from whale_lab.backends import make_backend
    from whale_lab.context import EpisodeSink, Evaluator
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import default_harness_path, sampling_params
    from whale_lab.quiet import quiet_libraries
    from whale_lab.store import RunStore, atomic_write_json

    quiet_libraries()
    k = k or cfg.sampling.k
    harness_path = Path(harness) if harness else default_harness_path(cfg)
    if not harness_path.exists():
        console.print(f"[red]error:[/] harness file {harness_path} not found")
        return 2
    domain = make_domain(cfg)
    tasks = domain.tasks(split)  # type: ignore[arg-type]
    if limit:
        tasks = tasks[:limit]
    backend = make_backend(cfg)
    store = RunStore.create(cfg.run.directory, f"eval-{cfg.domain.name}-{split}")
    signals.resume_at(store.root, f"run the same eval again (episodes so far: {store.root})")
    sink = EpisodeSink.for_store(
        store, None, f"eval-{split}", phase="eval", harness=harness_path.name
    )
    total = len(tasks) * k
    show = progress and not as_json and sys.stderr.isatty()
    bar = Progress(
        TextColumn("[bold]eval[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
        transient=True,
    )
    with bar:
        job = bar.add_task(f"{cfg.domain.name}/{split}", total=total)

        def on_episode(trace: EpisodeTrace) -> None:
            sink(trace)
            bar.advance(job)

        try:
            report = run_in_worker(
                lambda: Evaluator.from_config(cfg, backend, domain).score(
                    harness_path,
                    tasks,
                    k,
                    sampling_params(cfg, cfg.run.seed),
                    on_episode=on_episode,
                    should_stop=signals,
                )
            )
        finally:
            backend.close()
            domain.close()
    if signals() and report.rollouts < total:  # a stop that came after the last episode is none
        done = f"{report.rollouts} of {total} episodes"
        store.emit(RunFinished(status="stopped", message=f"eval stopped after {done}"))
        store.close()
        console.print(
            f"eval stopped after {done}; run the same eval again (episodes so far: {store.root})",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return signals.exit_code
    result = {
        "schema": EVAL_SCHEMA,
        "domain": cfg.domain.name,
        "split": split,
        "harness": from_cwd(harness_path),
        "model": cfg.model.path,
        "run_dir": from_cwd(store.root),
        **report.summary(),
    }
    atomic_write_json(store.root / "eval.json", result)
    store.close()
    if as_json:
        print(json.dumps(result, indent=2))
        return 0
    print_report(result)
    return 0


def print_report(result: dict[str, Any]) -> None:
    """The result of `run_eval` as a user reads it (stdout)."""
    from rich.console import Console
    from rich.table import Table

    from whale_lab import metrics

    console = Console()
    console.print(
        f"[bold]{result['domain']}[/] / {result['split']}  harness {result['harness']}  "
        f"model {result['model']}"
    )
    console.print(
        f"mean@{result['k']} [bold]{result['mean_at_k']:.3f}[/]   pass@{result['k']} "
        f"{result['pass_at_k']:.3f}   tasks {result['n_tasks']}   rollouts {result['rollouts']}   "
        f"mean turns {result['mean_turns']:.2f}   {result['seconds']:.1f}s"
    )
    table = Table(title="where failures come from", show_header=True)
    table.add_column("diagnostic")
    table.add_column("value", justify="right")
    table.add_column("unit")
    for row in metrics.summary_rows(result["domain"], result["diagnostics"]):
        table.add_row(*row)
    console.print(table)
    console.print(f"traces: {result['run_dir']}")
