"""Where one WHALE cycle's time goes on the embedded default: rollouts, SFT, harness, evaluation.

Runs the `whale` schedule headless (the engine with automatic approval, no display) on the
shipped `whale.toml` in a scratch folder and stops once cycle 1 is over: the start evaluation, the
weight phase with its evaluations, the harness phase and the evaluation point after it. The
engine's phase methods are wrapped with timers, each counting its own time without what runs
nested inside it:

    weight rollouts   RsftPhase._step less its update (rollouts, acceptance, publish and sync)
    SFT               RsftPhase.update
    harness           HarnessPhase.run less the proposer (validation, smoke, scoring, acceptance)
    proposer          HarnessPhase._propose
    start evaluation  the run's first point (val and test before any training or search: once a
                      run, the baseline every later number is read against)
    evaluation        every other evaluation point: RsftPhase._evaluate and the engine's own
    other             the rest of the wall time (model load, start-up, bookkeeping)

`tools` is the time spent stepping environments (tool calls, answer checks) inside the rollouts
of all the rows above, shown as its own share. Wall seconds and CPU seconds (this process and
every process below it: the sandboxed tool workers and harness hosts, read from /proc while they
live and just before they are stopped, `tree_cpu.py`) are both reported; on a shared machine CPU
seconds are the steadier figure. The run's events give the rollout counts beside.

    python benchmarks/cycle_split.py                         # one default cycle
    python benchmarks/cycle_split.py --set rsft.eval_every=0.5 --set domain.splits.val=24
    python benchmarks/cycle_split.py --set schedule.weight_epochs=0.1 --json   # a quick look
    python benchmarks/cycle_split.py --cycles 2              # the shipped run, both cycles

`--cycles N` times the run through cycle N instead (the start evaluation once, every later
point in its cycle), so a run's evaluation share is one measurement, not a sum of separate runs.

`--app` times the same cycle headless and in the app, arms alternated over `--rounds` rounds in
this one process (headless first in odd rounds, the app first in even ones), after `--warmup`
untimed rounds of both arms (default 1: the first cycle in a process pays imports, the model's
first load and the sandbox's first start, which a later one does not). The app arm is
`WhaleLabApp` driven by Textual's `App.run_test` at 120x40: the engine in the app's worker thread,
the UI on this thread redrawing as it would for a person (headless Textual draws the same
frames, it only does not write them to a terminal). It prints each arm's split (median over the
rounds) and app/headless throughput (headless seconds over app seconds: 1.0 means the app costs
nothing) per round, min/median/max, in CPU seconds (the whole process: the UI thread's work is the
app's cost) and in wall seconds. `--profile-ui FILE` keeps a cProfile of the UI thread over the
app arms (`python -m pstats FILE`).

    python benchmarks/cycle_split.py --app --rounds 3 --set schedule.weight_epochs=0.1
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ROWS = ("weight rollouts", "SFT", "harness", "proposer", "start evaluation", "evaluation", "other")


sys.path.insert(0, str(Path(__file__).resolve().parent))
import tree_cpu  # noqa: E402  (benchmarks/ is not a package)


def _clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process and every process below it)."""
    return time.perf_counter(), tree_cpu.seconds()


class Timers:
    """Exclusive time per category: a wrapped call's time, less that of wrapped calls inside it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start counting afresh (the wrapped methods stay wrapped: one cycle per arm)."""
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._stack: list[list[float]] = []  # per open call: nested wall, nested cpu
        self.frozen: tuple[dict[str, float], dict[str, float]] | None = None

    def wrap(self, owner: Any, name: str, category: str | Callable[..., str], *,
             nested: bool = False) -> None:
        """Time `owner.name`; `nested` times it inclusively, outside the exclusive split.
        `category` may be a function of the call's arguments."""
        fn = getattr(owner, name, None)
        if fn is None:
            print(f"note: {getattr(owner, '__name__', owner)}.{name} not found; not timed",
                  file=sys.stderr)
            return

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            row = category(*args, **kwargs) if callable(category) else category
            wall0, cpu0 = _clock()
            if not nested:
                self._stack.append([0.0, 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                wall1, cpu1 = _clock()
                dw, dc = wall1 - wall0, cpu1 - cpu0
                if nested:
                    self.wall[row] += dw
                    self.cpu[row] += dc
                else:
                    inner = self._stack.pop()
                    self.wall[row] += dw - inner[0]
                    self.cpu[row] += dc - inner[1]
                    if self._stack:
                        self._stack[-1][0] += dw
                        self._stack[-1][1] += dc

        setattr(owner, name, timed)

    def freeze(self) -> None:
        """Keep the totals as they are now (what runs after the cycle does not count)."""
        if self.frozen is None:
            self.frozen = (dict(self.wall), dict(self.cpu))


def _instrument(timers: Timers) -> None:
    from whale_lab import rollout
    from whale_lab.engine.evaluation import EvaluationPoints
    from whale_lab.search.meta_harness import HarnessPhase
    from whale_lab.weights.rsft import RsftPhase

    tree_cpu.track_departures()
    timers.wrap(RsftPhase, "_step", "weight rollouts")
    timers.wrap(RsftPhase, "update", "SFT")
    timers.wrap(RsftPhase, "_evaluate", "evaluation")
    timers.wrap(
        EvaluationPoints,
        "_engine_evaluation",
        lambda _self, cycle, phase, key: "start evaluation" if phase == "start" else "evaluation",
    )
    timers.wrap(HarnessPhase, "run", "harness")
    timers.wrap(HarnessPhase, "_propose", "proposer")
    timers.wrap(rollout, "_step_all", "tools", nested=True)


TIMERS = Timers()
_INSTRUMENTED: list[bool] = []


def _config(overrides: list[str], folder: Path) -> Any:
    from whale_lab.config import load_config

    return load_config(
        REPO / "whale.toml",
        [f"run.directory={json.dumps(str(folder / 'runs'))}", 'approval.mode="auto"',
         'schedule.kind="whale"', *overrides],
    )


def _engine_until_cycle(cfg: Any, root: Path, commands: Any, ends: list[Any], last: int = 1) -> Any:
    """An engine on `root` that is asked to stop as soon as cycle `last + 1` begins."""
    from whale_lab.engine.engine import Engine
    from whale_lab.events import PhaseStarted
    from whale_lab.reviewers import AutoReviewer
    from whale_lab.seams import Command
    from whale_lab.store import RunStore

    store = RunStore(root)

    def after_cycle_one(ev: Any) -> None:
        if isinstance(ev, PhaseStarted) and ev.cycle > last and not ends:
            ends.append(_clock())
            TIMERS.freeze()
            commands.send(Command("stop", by="benchmark", reason=f"cycle {last} is over"))

    store.subscribe(after_cycle_one)
    return Engine(cfg, store, reviewer=AutoReviewer(), commands=commands), store


def run_cycle(overrides: list[str], folder: Path, *, app: bool = False,
              profile: Any = None, cycles: int = 1) -> dict[str, Any]:
    """The run up to the end of cycle `cycles`, headless or in the app (`profile`: a
    cProfile.Profile for the UI thread)."""
    cfg = _config(overrides, folder)
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    if not _INSTRUMENTED:
        _instrument(TIMERS)
        _INSTRUMENTED.append(True)
    TIMERS.reset()
    timers = TIMERS
    from whale_lab.seams import CommandChannel

    ends: list[tuple[float, float]] = []
    root = folder / ("run-app" if app else "run")
    wall0, cpu0 = _clock()
    ui_cpu = 0.0
    if app:
        store, ui_cpu = _app_cycle(cfg, root, ends, profile, cycles)
    else:
        commands = CommandChannel()
        engine, store = _engine_until_cycle(cfg, root, commands, ends, cycles)
        engine.run()
        store.close()
    end_wall, end_cpu = ends[0] if ends else _clock()
    wall_total, cpu_total = end_wall - wall0, end_cpu - cpu0
    walls, cpus = timers.frozen or (dict(timers.wall), dict(timers.cpu))
    measured = [r for r in ROWS if r != "other"]
    walls["other"] = wall_total - sum(walls.get(r, 0.0) for r in measured)
    cpus["other"] = cpu_total - sum(cpus.get(r, 0.0) for r in measured)
    return {
        "config": {
            "rsft.eval_every": cfg.rsft.eval_every,
            "eval.test_every": getattr(getattr(cfg, "eval", None), "test_every", "always"),
            "splits": {s: getattr(cfg.domain.splits, s) for s in ("weight", "harness", "val", "test")},
            "k": cfg.sampling.k,
            "weight_epochs": cfg.schedule.weight_epochs,
            "harness_iterations": cfg.schedule.harness_iterations,
            "threads": os.environ.get("OMP_NUM_THREADS", "torch default"),
        },
        "wall_s": wall_total,
        "cpu_s": cpu_total,
        "rows": {r: {"wall_s": walls.get(r, 0.0), "cpu_s": cpus.get(r, 0.0)} for r in ROWS},
        "tools": {"wall_s": walls.get("tools", 0.0), "cpu_s": cpus.get("tools", 0.0)},
        "events": _from_events(store.root, cycles),
        "cycles": cycles,
        "run": str(store.root),
        "completed_cycle": bool(ends),
        "arm": "app" if app else "headless",
        "ui_thread_cpu_s": ui_cpu,  # the app arm: CPU seconds of the UI thread alone
    }


def drive_app(app: Any, size: tuple[int, int], profile: Any = None) -> float:
    """Run `app` under Textual's `run_test` at `size` until its engine worker has finished; the
    CPU seconds of the UI thread (this one) meanwhile. `profile`: a cProfile.Profile to enable."""
    import asyncio

    async def drive() -> None:
        # Poll with a plain sleep: `pilot.pause` waits for every widget to drain its queue
        # (a callback posted to each), UI work a person's app never does.
        async with app.run_test(size=size):
            while not app._engine_started or app.engine_running:
                await asyncio.sleep(0.5)
            if app.engine_error:
                raise RuntimeError(f"the engine failed in the app: {app.engine_error}")

    ui0 = time.thread_time()
    if profile is not None:
        profile.enable()
    try:
        asyncio.run(drive())
    finally:
        if profile is not None:
            profile.disable()
    return time.thread_time() - ui0


def _app_cycle(cfg: Any, root: Path, ends: list[Any], profile: Any,
               cycles: int = 1) -> tuple[Any, float]:
    """The cycle in the app: `App.run_test` at 120x40 until the engine worker has finished."""

    from whale_lab.tui.app import WhaleLabApp

    stores: list[Any] = []

    def factory(cfg_: Any, run_dir: Any, reviewer: Any, commands: Any) -> tuple[Any, Any]:
        engine, store = _engine_until_cycle(cfg_, root, commands, ends, cycles)
        stores.append(store)
        return engine, store

    app = WhaleLabApp(cfg, engine_factory=factory)
    ui = drive_app(app, (120, 40), profile)
    return stores[-1], ui


def _from_events(root: Path, last: int = 1) -> dict[str, Any]:
    """Rollouts by phase and evaluation results up to the end of cycle `last`, from events.jsonl."""
    from whale_lab.events import (
        EpisodeFinished,
        EvalResult,
        PhaseStarted,
        ProposerUsage,
        WeightStep,
    )
    from whale_lab.store import RunStore

    episodes: Counter[str] = Counter()
    evals: Counter[str] = Counter()
    step_s = proposer_s = 0.0
    for e in RunStore.read_events(root):
        if isinstance(e, PhaseStarted) and e.cycle > last:
            break
        if isinstance(e, EpisodeFinished):
            episodes[e.phase] += 1
        elif isinstance(e, EvalResult):
            evals[e.split] += 1
        elif isinstance(e, WeightStep):
            step_s += e.step_seconds
        elif isinstance(e, ProposerUsage):
            proposer_s += e.seconds
    return {
        "rollouts": dict(episodes),
        "eval_results": dict(evals),
        "weight_step_seconds": step_s,
        "proposer_seconds": proposer_s,
    }


def _print(result: dict[str, Any], out: Callable[[str], None] = print) -> None:
    c = result["config"]
    n = result.get("cycles", 1)
    span = "one WHALE cycle" if n == 1 else f"a WHALE run through cycle {n}"
    out(f"{span} on the embedded default ({result['run']})")
    out(f"  rsft.eval_every {c['rsft.eval_every']}, eval.test_every {c['eval.test_every']}, "
        f"splits {c['splits']}, k {c['k']}, weight_epochs {c['weight_epochs']}, harness "
        f"iterations {c['harness_iterations']}, OMP_NUM_THREADS {c['threads']}")
    if not result["completed_cycle"]:
        out(f"  note: the run ended before cycle {n + 1} began; figures cover the whole run")
    wall, cpu = result["wall_s"], result["cpu_s"]
    out(f"  {'':18}{'wall s':>9}{'wall %':>8}{'CPU s':>9}{'CPU %':>8}")
    for name, row in (*result["rows"].items(), ("tools (inside)", result["tools"])):
        out(f"  {name:18}{row['wall_s']:9.1f}{100 * row['wall_s'] / wall:7.1f}%"
            f"{row['cpu_s']:9.1f}{100 * row['cpu_s'] / cpu:7.1f}%")
    out(f"  {'cycle':18}{wall:9.1f}{100.0:7.1f}%{cpu:9.1f}{100.0:7.1f}%")
    ev = result["events"]
    out(f"  rollouts: {ev['rollouts']}; evaluation results: {ev['eval_results']}")
    share = result["rows"]["evaluation"]
    start = result["rows"]["start evaluation"]
    out(f"  evaluation share: {100 * (share['wall_s'] + start['wall_s']) / wall:.1f}% of wall, "
        f"{100 * (share['cpu_s'] + start['cpu_s']) / cpu:.1f}% of CPU (target <= 25%); "
        f"without the run's start evaluation {100 * share['wall_s'] / (wall - start['wall_s']):.1f}%"
        f" / {100 * share['cpu_s'] / (cpu - start['cpu_s']):.1f}%")


def _stats(values: list[float]) -> str:
    return f"min {min(values):.3f}  median {_median(values):.3f}  max {max(values):.3f}"


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's rounds folded into their medians, row by row."""
    out = dict(results[0])
    out["wall_s"] = _median([r["wall_s"] for r in results])
    out["cpu_s"] = _median([r["cpu_s"] for r in results])
    out["rows"] = {
        row: {k: _median([r["rows"][row][k] for r in results]) for k in ("wall_s", "cpu_s")}
        for row in ROWS
    }
    out["tools"] = {k: _median([r["tools"][k] for r in results]) for k in ("wall_s", "cpu_s")}
    out["completed_cycle"] = all(r["completed_cycle"] for r in results)
    out["ui_thread_cpu_s"] = _median([r["ui_thread_cpu_s"] for r in results])
    return out


def compare_arms(overrides: list[str], rounds: int, folder: Path,
                 profile_path: str | None, warmup: int = 1) -> dict[str, Any]:
    """Headless and app arms alternated over `rounds` (after `warmup` untimed rounds of both);
    per-round app/headless ratios."""
    import cProfile

    for i in range(warmup):
        for arm in ("headless", "app"):
            sub = folder / f"warmup-{i}-{arm}"
            sub.mkdir(parents=True)
            run_cycle(overrides, sub, app=arm == "app")
    profile = cProfile.Profile() if profile_path else None
    arms: dict[str, list[dict[str, Any]]] = {"headless": [], "app": []}
    for i in range(rounds):
        order = ("headless", "app") if i % 2 == 0 else ("app", "headless")
        for arm in order:
            sub = folder / f"round-{i}-{arm}"
            sub.mkdir(parents=True)
            arms[arm].append(run_cycle(overrides, sub, app=arm == "app", profile=profile))
    if profile is not None and profile_path:
        profile.dump_stats(profile_path)
    ratios = {
        unit: [h[f"{unit}_s"] / a[f"{unit}_s"] for h, a in zip(arms["headless"], arms["app"], strict=True)]
        for unit in ("cpu", "wall")
    }
    return {
        "rounds": rounds,
        "warmup_rounds": warmup,
        "cpu_counts_sandboxed": tree_cpu.read().exact,
        "headless": _median_result(arms["headless"]),
        "app": _median_result(arms["app"]),
        "ratio_cpu": ratios["cpu"],
        "ratio_wall": ratios["wall"],
        "ratio_cpu_median": _median(ratios["cpu"]),
        "ratio_wall_median": _median(ratios["wall"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override, as for whale-lab")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", action="store_true", help="keep the run folder")
    parser.add_argument("--app", action="store_true",
                        help="time the cycle headless and in the app, arms alternated")
    parser.add_argument("--cycles", type=int, default=1,
                        help="time the run through this cycle (not with --app)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both arms (--app)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed rounds of both arms before the timed ones (--app)")
    parser.add_argument("--profile-ui", default=None, metavar="FILE",
                        help="cProfile of the UI thread over the app arms (--app)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.cycles < 1 or (args.app and args.cycles != 1):
        parser.error("--cycles must be at least 1, and 1 with --app")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    try:
        from whale_lab.threads import configure
    except ImportError:  # a checkout from before whale-lab chose its threads
        pass
    else:
        configure()  # the thread count whale-lab's own commands use
    folder = Path(tempfile.mkdtemp(prefix="whale-cycle-"))
    try:
        if args.app:
            result = compare_arms(args.overrides, args.rounds, folder, args.profile_ui,
                                  args.warmup)
        else:
            result = run_cycle(args.overrides, folder, cycles=args.cycles)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=1))
    elif args.app:
        for arm in ("headless", "app"):
            print(f"[{arm}, median of {result['rounds']} rounds]")
            _print(result[arm])
        ui, cpu = result["app"]["ui_thread_cpu_s"], result["app"]["cpu_s"]
        print(f"UI thread: {ui:.1f} CPU s of the app arm's {cpu:.1f} (median)")
        print(f"app/headless throughput over {result['rounds']} rounds after "
              f"{result['warmup_rounds']} untimed (target >= 0.95):")
        print(f"  CPU seconds   {_stats(result['ratio_cpu'])}")
        print(f"  wall seconds  {_stats(result['ratio_wall'])}")
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
