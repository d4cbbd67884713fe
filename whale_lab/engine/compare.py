"""Comparing schedules: schedules x seeds on one domain, one run folder each, one report.

Every run gets a fresh backend (so each starts from the base weights) and its own domain object
(splits depend on the seed); approval is `approval.headless_mode` since nobody reviews. Run
folders are `<out>/<schedule>-seed<seed>/`; running the same comparison again skips the runs that
completed and resumes those that did not. The report (`report.write_comparison`) lands in `<out>`:
`summary.md` (the paper's main-table layout with 95% t-intervals across seeds and the best-on-test
column marked as the paper's way), `results.json`, and accuracy-vs-rollouts plots (PNG, SVG).
`compare_runs` leaves how each run is driven and shown to its caller (`whale-lab compare`, in
`whale_lab.commands.compare`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from whale_lab.config import Config
from whale_lab.engine.headless import headless_config
from whale_lab.engine.schedules import SCHEDULES
from whale_lab.errors import WhaleLabError
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json

if TYPE_CHECKING:
    from whale_lab.engine.engine import Engine

# Drives one run to its end and says how it ended: "done", "stopped" or "left".
RunDriver = Callable[["Engine", CommandChannel, RunStore, str], str]


class CompareError(WhaleLabError, ValueError):
    """A bad list of schedules or seeds, or an output folder that cannot be used."""


def run_folder(out_dir: str | Path, schedule: str, seed: int) -> Path:
    return Path(out_dir) / f"{schedule}-seed{seed}"


def _check(schedules: Sequence[str], seeds: Sequence[int]) -> tuple[list[str], list[int]]:
    if not schedules:
        raise CompareError("compare: give at least one schedule")
    unknown = [s for s in schedules if s not in SCHEDULES]
    if unknown:
        import difflib

        close = difflib.get_close_matches(unknown[0], SCHEDULES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CompareError(
            f"compare: unknown schedule {unknown[0]!r}{hint}; choose from {', '.join(SCHEDULES)}"
        )
    if not seeds:
        raise CompareError("compare: give at least one seed")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise CompareError(f"compare: seeds must be integers >= 0, got {s!r}")
    return list(dict.fromkeys(schedules)), list(dict.fromkeys(seeds))


def run_config(
    cfg: Config, schedule: str, seed: int, out_dir: str | Path, *, split_seed: int | None = None
) -> Config:
    """The config of one run of the comparison; `split_seed` fixes the tasks across seeds."""
    out = headless_config(cfg).replace(
        schedule=dataclasses.replace(cfg.schedule, kind=schedule),  # type: ignore[arg-type]
        run=dataclasses.replace(
            cfg.run, seed=seed, name=f"{schedule}-seed{seed}", directory=str(out_dir)
        ),
    )
    if split_seed is not None:
        out = out.replace(domain=dataclasses.replace(out.domain, split_seed=split_seed))
    return out


def _check_one_task_set(out: Path, split_seed: int) -> None:
    """Every run already in `out` must have drawn its tasks with `split_seed`: the report pairs
    the runs task by task, and runs on other splits would be pooled as if they shared tasks.
    (`--seeds 1` alone draws with split seed 1, the first of its seeds: a comparison run one
    seed per process must fix `domain.split_seed`.)"""
    for folder in sorted(p for p in out.iterdir() if (p / "config.json").is_file()):
        config = read_json(folder / "config.json", {}) or {}
        domain = config.get("domain") if isinstance(config, dict) else None
        theirs = domain.get("split_seed") if isinstance(domain, dict) else None
        if isinstance(theirs, int) and theirs >= 0 and theirs != split_seed:
            raise CompareError(
                f"compare: {folder} drew its tasks with domain.split_seed {theirs}, this "
                f"comparison with {split_seed} (domain.split_seed, else the first of --seeds); "
                f"paired runs need one task set: add --set domain.split_seed={theirs}, or use "
                "another --out"
            )


def _completed(folder: Path) -> bool:
    state = read_json(folder / "state.json", {}) or {}
    return state.get("status") == "completed"


@dataclass
class CompareOutcome:
    """How a comparison ended. "done": every run ended and the report is at `summary` (the runs
    that raised are named in `failed`); "stopped" / "left": the run in `folder` was stopped on
    request / left at once, and running the comparison again resumes it."""

    status: Literal["done", "stopped", "left"]
    folder: Path | None = None
    summary: Path | None = None
    failed: list[str] = field(default_factory=list)


def compare_runs(
    cfg: Config,
    schedules: Sequence[str],
    seeds: Sequence[int],
    out_dir: str | Path,
    *,
    drive_run: RunDriver,
    log: Callable[[str], None],
    resplit: bool = False,
) -> CompareOutcome:
    """Run every schedule with every seed (sequentially), then write the comparison report.

    By default every run draws the same tasks and splits (`domain.split_seed`, else the first
    seed), so schedules are paired on one task set and the seed varies sampling and training only;
    `resplit` lets each seed draw its own splits (the other design).

    `drive_run(engine, commands, store, label)` runs one engine to its end; `log` gets one line
    per run that is skipped (already completed) or that raised. Bad requests raise CompareError.
    """
    from whale_lab.engine.engine import EngineError, create_run
    from whale_lab.engine.report import summarise_run, write_comparison

    schedules, seeds = _check(schedules, seeds)
    fixed: int | None = None
    if not resplit:
        fixed = cfg.domain.split_seed if cfg.domain.split_seed >= 0 else seeds[0]
    if cfg.approval.headless_mode == "manual":
        raise CompareError(
            'compare runs unattended: set approval.headless_mode to "auto" or "threshold"'
        )
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise CompareError(f"compare: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    if fixed is not None:
        _check_one_task_set(out, fixed)
    folders: list[Path] = []
    failed: list[str] = []
    total = len(schedules) * len(seeds)
    n = 0
    for schedule in schedules:
        for seed in seeds:
            n += 1
            folder = run_folder(out, schedule, seed)
            label = f"[{n}/{total} {schedule} seed {seed}] "
            folders.append(folder)
            if _completed(folder):
                log(f"{label}already completed: {folder}")
                continue
            commands = CommandChannel()
            try:
                engine, store = create_run(
                    run_config(cfg, schedule, seed, out, split_seed=fixed),
                    folder,
                    reviewer=AutoReviewer(),
                    commands=commands,
                )
            except EngineError as exc:
                raise CompareError(f"{folder}: {exc}") from None
            try:
                how = drive_run(engine, commands, store, label)
            except Exception as exc:  # noqa: BLE001 - one failed run must not sink the others
                log(f"{label}failed: {type(exc).__name__}: {exc}")
                failed.append(folder.name)
                continue
            finally:
                store.close()
            if how == "left":
                return CompareOutcome("left", folder=folder, failed=failed)
            if how != "done" or engine.state.status != "completed":
                return CompareOutcome("stopped", folder=folder, failed=failed)
    summaries = [summarise_run(f) for f in folders if (f / "events.jsonl").exists()]
    title = f"Schedule comparison, model {cfg.model.path}"
    summary = write_comparison(out, summaries, title=title)
    return CompareOutcome("done", summary=summary, failed=failed)
