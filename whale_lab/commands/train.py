"""`whale-lab train`: weight-only RSFT for the whole budget (`rsft.epochs`) under one fixed harness.

The run folder holds the config, a copy of the harness (so the harness stays fixed even if the
file is edited), the events, the traces and the weights. Ctrl-C or SIGTERM stops at the next
completed step (recorded; exit 130 or 143), a second Ctrl-C leaves at once; a run stopped either
way or killed outright resumes from its last completed step with `whale-lab train --resume RUN_DIR`.

Before the baseline evaluation every server the run needs is preflighted (the model's chat
endpoint, the endpoint the weight phase publishes to, the search judge when it is on), so a
server without, say, the adapter endpoint fails in seconds; a run that fails for any reason
ends its events with `run_finished` (status `failed`, the error as its message).
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale_lab.commands.common import EXIT_OK, EXIT_USAGE, StopSignals, run_in_worker
from whale_lab.config import Config, ConfigError, config_from_dict
from whale_lab.events import (
    EvalResult,
    Event,
    PhaseEnded,
    PhaseStarted,
    RunFinished,
    RunStarted,
    WeightStep,
)
from whale_lab.store import RunStore, atomic_write_json, read_json

SCHEDULE = "weight-only"


def _user_errors() -> tuple[type[BaseException], ...]:
    """Problems with a user's input or files: one line on stderr, no traceback."""
    from whale_lab.backends.base import BackendError
    from whale_lab.weights.lora import WeightsError
    from whale_lab.weights.sampler import SamplerStateError

    kinds: list[type[BaseException]] = [
        ConfigError,
        BackendError,
        WeightsError,
        SamplerStateError,
        FileNotFoundError,
    ]
    try:
        from whale_lab.harness import HarnessLoadError

        kinds.append(HarnessLoadError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(kinds)


def run_train(
    cfg: Config,
    run_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = True,
    *,
    adapter: str | Path | None = None,
) -> int:
    """Train; 0 when the budget is done, 130/143 when stopped by SIGINT/SIGTERM (resumable), 2 on
    a user's mistake.

    `run_dir`: with `resume`, the run to resume (default: the newest train run under
    `run.directory`); without, the folder to create the run in (default: a new one there).
    `adapter`: a peft adapter folder to start from (LoRA only; ignored on resume).
    """
    from rich.console import Console

    console = Console(stderr=True, highlight=False)
    with StopSignals(console) as signals:
        try:
            return _train(cfg, run_dir, resume, progress, adapter, console, signals)
        except _user_errors() as exc:
            console.print(f"whale-lab train: error: {exc}", markup=False, soft_wrap=True)
            return EXIT_USAGE


def _newest_train_run(directory: str | Path) -> Path:
    base = Path(directory)
    runs = sorted(
        (p for p in base.glob("*") if (p / "train.json").exists()),
        key=lambda p: (p / "train.json").stat().st_mtime,
    )
    if not runs:
        raise FileNotFoundError(f"no train run to resume under {base}/ (pass the run folder)")
    return runs[-1]


def _prepare_run(
    cfg: Config, run_dir: str | Path | None, resume: bool, console: Any
) -> tuple[Config, RunStore, Path]:
    """The run's config, store and fixed harness copy (new, or read back for a resume)."""
    from whale_lab.evaluate import default_harness_path

    if resume:
        root = Path(run_dir) if run_dir else _newest_train_run(cfg.run.directory)
        meta = read_json(root / "train.json")
        if not root.is_dir() or not isinstance(meta, dict):
            raise FileNotFoundError(f"{root} is not a whale-lab train run (no train.json)")
        try:
            saved = config_from_dict(meta["config"])
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"{root / 'train.json'}: no usable config ({exc})") from None
        if saved.to_dict() != cfg.to_dict():
            console.print(f"resuming with the config saved in {root} (the given one is ignored)")
        harness = root / str(meta.get("harness", ""))
        if not harness.is_file():
            raise FileNotFoundError(f"the run's harness copy {harness} is missing")
        return saved, RunStore(root), harness

    source = default_harness_path(cfg).expanduser().resolve()
    if not source.is_file():
        raise FileNotFoundError(f"harness file {source} not found (domain.harness)")
    cfg = cfg.replace(domain=dataclasses.replace(cfg.domain, harness=str(source)))
    if run_dir:
        store = RunStore(run_dir)
        if (store.root / "train.json").exists():
            raise ConfigError(
                f"{store.root} already holds a train run; resume it with --resume {store.root}"
            )
    else:
        name = cfg.run.name if cfg.run.name != "default" else f"train-{cfg.domain.name}"
        store = RunStore.create(cfg.run.directory, name)
    harness = store.root / "harness" / source.name
    harness.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, harness)
    atomic_write_json(
        store.root / "train.json",
        {
            "config": cfg.to_dict(),
            "harness": str(harness.relative_to(store.root)),
            "harness_source": str(source),
            "schedule": SCHEDULE,
        },
    )
    atomic_write_json(store.root / "config.json", cfg.to_dict())
    return cfg, store, harness


class _Display:
    """A progress bar on a terminal, one line per step and evaluation otherwise."""

    def __init__(self, console: Any, enabled: bool, total: int, done: int) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.live = enabled and console.is_terminal
        self.lines = enabled and not self.live
        self.val = ""
        self.bar = Progress(
            TextColumn("[bold]train[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not self.live,
        )
        self.task = self.bar.add_task("", total=total, completed=done)

    def __enter__(self) -> _Display:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(None, None, None)

    def __call__(self, event: Event) -> None:
        if isinstance(event, WeightStep):
            loss = "-" if event.loss is None else f"{event.loss:.3f}"
            text = (
                f"reward {event.train_reward:.3f} accept {event.accept_rate:.2f} "
                f"loss {loss}{self.val}"
            )
            self.bar.update(self.task, advance=1, description=text)
            if self.lines:
                self.console.print(
                    f"step {event.step} epoch {event.epoch:.3f} {text} "
                    f"tokens {event.tokens} {event.step_seconds:.1f}s",
                    markup=False,
                    soft_wrap=True,
                )
        elif isinstance(event, EvalResult):
            if event.split == "val":
                self.val = f" | val mean@{event.k} {event.mean_at_k:.3f}"
            if self.lines or self.live:
                self.console.print(
                    f"eval {event.split}: mean@{event.k} {event.mean_at_k:.3f} "
                    f"pass@{event.k} {event.pass_at_k:.3f} ({event.n_tasks} tasks)",
                    markup=False,
                    soft_wrap=True,
                )


def _train(
    cfg: Config,
    run_dir: str | Path | None,
    resume: bool,
    progress: bool,
    adapter: str | Path | None,
    console: Any,
    stop: StopSignals,
) -> int:
    from whale_lab.context import RunContext
    from whale_lab.domains import make_domain
    from whale_lab.quiet import quiet_libraries
    from whale_lab.weights.rsft import RsftPhase, trains_in_place

    quiet_libraries()
    cfg, store, harness = _prepare_run(cfg, run_dir, resume, console)
    stop.resume_at(store.root, f"resume with: whale-lab train --resume {store.root}")
    if resume and store.read_state().get("status") == "completed":
        console.print(
            f"{store.root}: this train run is already complete", markup=False, soft_wrap=True
        )
        _print_summary(store.read_state().get("evals", []), store.read_state())
        store.close()
        return EXIT_OK
    listeners: list[Callable[[Event], None]] = []

    def emit(event: Event) -> None:
        store.emit(event)
        for listener in listeners:
            listener(event)

    domain = backend = None
    try:
        domain = make_domain(cfg)
        backend = _start_backend(cfg)
        _preflight(cfg, backend, publishes=not trains_in_place(backend))
        phase = RsftPhase(
            RunContext.of(cfg, backend, domain, store, emit),
            init_adapter=None if resume else adapter,
        )
        resumed = phase.resume() if resume else False
        if resume and not resumed:
            console.print("no completed step to resume from: starting at step 0")
        emit(
            RunStarted(
                run_id=store.run_id,
                domain=cfg.domain.name,
                model=cfg.model.path,
                schedule=SCHEDULE,
                harness=str(harness),
                config=cfg.to_dict(),
                resumed=resumed,
            )
        )
        emit(
            PhaseStarted(
                cycle=0,
                phase="weight",
                budget=cfg.rsft.epochs,
                budget_unit="epochs",
                harness=str(harness),
            )
        )
        total = phase.steps_for(cfg.rsft.epochs)
        # A resumed run whose phase already ended (killed while finishing) only needs its
        # final evaluation; starting a new phase would train a second budget.
        finished = resumed and not phase.phase_active and phase.step > 0
        done = phase.step if (phase.phase_active or finished) else 0
        with _Display(console, progress, total, done) as display:
            listeners.append(display)
            if finished:
                stopped = False
                if not phase.evals or phase.evals[-1].step != phase.step:
                    stopped = run_in_worker(
                        lambda: phase.evaluate(harness, should_stop=stop) is None
                    )
            else:
                result = run_in_worker(
                    lambda: phase.run(
                        harness,
                        epochs=cfg.rsft.epochs,
                        should_stop=stop,
                        eval_at_start=True,
                        final_eval=True,
                    )
                )
                stopped = result.reason == "stop"
        emit(
            PhaseEnded(
                cycle=0,
                phase="weight",
                reason="stop" if stopped else "budget",
                weight_rollouts=phase.rollouts,
            )
        )
        evals = [dataclasses.asdict(e) for e in phase.evals]
        state = {
            "status": "stopped" if stopped else "completed",
            "step": phase.step,
            "weight_rollouts": phase.rollouts,
            "eval_rollouts": phase.eval_rollouts,
            "best": phase.best,
            "evals": evals,
        }
        store.write_state(state)
        emit(
            RunFinished(
                status="stopped" if stopped else "completed",
                message=f"step {phase.step}",
                best=phase.best or {},
            )
        )
        if stopped:
            console.print(
                f"stopped after step {phase.step}; resume with: "
                f"whale-lab train --resume {store.root}",
                markup=False,
                soft_wrap=True,
            )
            return stop.exit_code
        _print_summary(evals, state)
        print(f"run: {store.root}")
        return EXIT_OK
    except Exception as exc:
        _record_failure(store, emit, exc)
        raise
    finally:
        if backend is not None:
            backend.close()
        if domain is not None:
            domain.close()
        store.close()


def _preflight(cfg: Config, backend: Any, *, publishes: bool) -> None:
    """Every server the run needs answers before the first rollout, else one line: the model's
    chat endpoint; the endpoint the weight phase publishes to (`publishes`: LoRA adapters, or
    full weights when it trains in full); the search judge's when `[domain.judge]` is on."""
    from whale_lab.engine.engine import check_endpoint, side_endpoints

    check = getattr(backend, "preflight", None)
    if callable(check) and getattr(backend, "verify", False):
        check(adapters=publishes)
    for endpoint in side_endpoints(cfg, proposer=False):  # no harness search in this command
        check_endpoint(endpoint)


def _record_failure(store: RunStore, emit: Callable[[Event], None], exc: Exception) -> None:
    """A run that fails ends its events with `run_finished` failed and says so in its state (a
    later `--resume` continues from its last completed step all the same)."""
    message = str(exc).strip()
    if not isinstance(exc, _user_errors()) or not message:  # a bug: say what kind
        message = f"{type(exc).__name__}: {message}".rstrip(": ")
    try:
        store.write_state({**store.read_state(), "status": "failed", "message": message})
        emit(RunFinished(status="failed", message=message))
    except Exception:  # noqa: BLE001 - the original error matters more
        pass


def _start_backend(cfg: Config) -> Any:
    """The configured backend; a model folder that does not load is the user's to fix."""
    from whale_lab.backends import make_backend
    from whale_lab.backends.base import BackendError

    try:
        return make_backend(cfg)
    except BackendError:
        raise
    except Exception as exc:  # noqa: BLE001 - corrupt weights, a bad config.json, ...
        raise BackendError(
            f"model.path {cfg.model.path!r}: cannot load the model ({type(exc).__name__}: {exc})"
        ) from None


def _print_summary(evals: list[dict], state: dict) -> None:
    """The result goes to stdout (progress and notes go to stderr)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)

    if not evals:
        return
    table = Table(title="weight-only RSFT: evaluations", show_header=True)
    for col in ("step", "epoch", "val mean@k", "test mean@k"):
        table.add_column(col, justify="right")
    best = (state.get("best") or {}).get("step")
    for e in evals:
        mark = " *" if e["step"] == best else ""
        test = "-" if e.get("test") is None else f"{e['test']:.3f}"
        table.add_row(str(e["step"]), f"{e['epoch']:.3f}", f"{e['val']:.3f}{mark}", test)
    console.print(table)
    if best is not None:
        b = state["best"]
        console.print(
            f"best by val: step {b['step']} (val {b['val_mean_at_k']:.3f}, "
            f"test {b['test_mean_at_k']:.3f}) -> {b['path']}",
            markup=False,
            soft_wrap=True,
        )
