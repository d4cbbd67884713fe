"""What the app's UI thread costs on its own: a recorded cycle's events replayed into the app.

`cycle_split.py --app` measures the app against headless on a whole cycle, where the engine's
own noise (sampling, SFT, sandboxed tools) is most of both arms and the UI's share is a few
percent. This benchmark takes the engine out: it records one short WHALE cycle headless once
(or reads `--from RUN`), then replays its events into `WhaleLabApp` (Textual's `run_test` at
`--size`) at the pace they were written, from a thread standing in for the engine worker, so the
app receives the same events at the same rate as a person's app would. Every round measures the
CPU seconds of the UI thread (`time.thread_time`) and prints them per second of replay, with
min/median/max over `--rounds`; the replay thread's own work (emitting events) is not counted.

    OMP_NUM_THREADS=1 python benchmarks/ui_replay.py                  # record one cycle, 3 rounds
    python benchmarks/ui_replay.py --from runs/<run> --rounds 5 --json
    python benchmarks/ui_replay.py --size 80x24 --speed 2            # twice the recorded rate

The recording uses the same short cycle as the README's `cycle_split.py --app` command unless
`--set` says otherwise. `--profile FILE` keeps a cProfile of the UI thread over all rounds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import cycle_split  # noqa: E402  (benchmarks/ is not a package)

SHORT_CYCLE = (
    "domain.splits.val=8", "domain.splits.test=8", "domain.splits.harness=8", "sampling.k=2",
    "schedule.weight_epochs=0.0625", "schedule.harness_iterations=2",
)


def record(overrides: list[str], folder: Path) -> Path:
    """One headless cycle (as `cycle_split.py` runs it); the run folder it wrote."""
    result = cycle_split.run_cycle(overrides, folder)
    if not result["completed_cycle"]:
        raise SystemExit("ui_replay: the recorded run ended before cycle 1 was over")
    return Path(result["run"])


class ReplayEngine:
    """Stands in for the engine in the app's worker thread: emits a recorded run's events
    through the run store at the pace they were first written (`speed` times faster)."""

    def __init__(self, events: list[Any], store: Any, speed: float) -> None:
        self.events = events
        self.store = store
        self.speed = speed
        self.emit_cpu_s = 0.0

    def run(self) -> None:
        if not self.events:
            return
        t0_rec, t0 = self.events[0].ts, time.monotonic()
        cpu0 = time.thread_time()
        for ev in self.events:
            due = t0 + (ev.ts - t0_rec) / self.speed
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self.store.emit(ev)
        self.emit_cpu_s = time.thread_time() - cpu0


def replay_round(source: Path, folder: Path, size: tuple[int, int], speed: float,
                 profile: Any = None) -> dict[str, float]:
    """One replay of `source`'s events into a fresh app; the UI thread's CPU and the wall."""
    from whale_lab.config import load_config
    from whale_lab.store import RunStore
    from whale_lab.tui.app import WhaleLabApp

    events = RunStore.read_events(source)
    root = folder / "run"
    # the run folder's other files (traces, candidates, review packs) as the app would find them
    shutil.copytree(source, root, ignore=shutil.ignore_patterns("events.jsonl", "*.lock"))
    cfg = load_config(REPO / "whale.toml", [f"run.directory={json.dumps(str(folder))}",
                                           'approval.mode="auto"'])
    engines: list[ReplayEngine] = []

    def factory(cfg_: Any, run_dir: Any, reviewer: Any, commands: Any) -> tuple[Any, Any]:
        store = RunStore(root)
        engines.append(ReplayEngine(events, store, speed))
        return engines[-1], store

    app = WhaleLabApp(cfg, engine_factory=factory)
    wall0 = time.perf_counter()
    ui = cycle_split.drive_app(app, size, profile)
    wall = time.perf_counter() - wall0
    return {
        "wall_s": wall,
        "ui_cpu_s": ui,
        "ui_cpu_per_s": ui / wall,
        "events": len(events),
        "emit_cpu_s": engines[0].emit_cpu_s if engines else 0.0,
    }


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size wants WIDTHxHEIGHT, got {text!r}") from None
    return w, h


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", default=None, metavar="RUN",
                        help="replay this run folder instead of recording a cycle")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="a config override for the recorded cycle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=_size, default=(120, 40), help="WIDTHxHEIGHT")
    parser.add_argument("--speed", type=float, default=1.0, help="replay rate over the recorded")
    parser.add_argument("--profile", default=None, metavar="FILE")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.speed <= 0:
        parser.error("--rounds must be at least 1 and --speed above 0")
    import cProfile

    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    with tempfile.TemporaryDirectory(prefix="whale-ui-replay-") as tmp:
        folder = Path(tmp)
        if args.source is not None:
            source = Path(args.source)
            if not (source / "events.jsonl").is_file():
                parser.error(f"--from {source}: no events.jsonl there")
        else:
            source = record([*SHORT_CYCLE, *args.overrides], folder / "record")
        profile = cProfile.Profile() if args.profile else None
        rounds = []
        for i in range(args.rounds):
            sub = folder / f"replay-{i}"
            sub.mkdir()
            rounds.append(replay_round(source, sub, args.size, args.speed, profile))
        if profile is not None:
            profile.dump_stats(args.profile)
    per_s = [r["ui_cpu_per_s"] for r in rounds]
    result = {
        "size": f"{args.size[0]}x{args.size[1]}",
        "speed": args.speed,
        "events": rounds[0]["events"],
        "rounds": rounds,
        "ui_cpu_per_s": {"min": min(per_s), "median": _median(per_s), "max": max(per_s)},
        "ui_cpu_s_median": _median([r["ui_cpu_s"] for r in rounds]),
        "wall_s_median": _median([r["wall_s"] for r in rounds]),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"replayed {result['events']} events at {args.speed}x into the app at "
              f"{result['size']}, {args.rounds} rounds")
        print(f"  UI thread CPU per second of replay: min {min(per_s):.3f}  median "
              f"{_median(per_s):.3f}  max {max(per_s):.3f}")
        print(f"  UI thread CPU per round (median): {result['ui_cpu_s_median']:.2f} s of "
              f"{result['wall_s_median']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
