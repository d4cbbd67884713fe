"""What one math `python` tool call costs: a warm worker against a fresh process per call.

The warm arm is one episode's worker (`ToolWorkers`, the math environment's path) taking call
after call; the cold arm is `run_python`, which starts a sandboxed interpreter per call. The two
are interleaved call by call, so machine noise lands on both. A third arm times the first call
of a new episode, which takes a spare worker started ahead of it (and starts the next spare).
Wall times per call are printed as min / median / max. (CPU time is not reported: the sandboxed
interpreter's CPU time does not reach this process's children total through bwrap's namespaces.)

    python benchmarks/tool_call_latency.py --calls 100

Target (issue 16, warm tool workers): under 30 ms median wall time per call on a warm worker.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

from whale_lab import confine
from whale_lab.domains.interpreter import InterpreterLimits, PythonResult, run_python
from whale_lab.domains.tool_worker import ToolWorkers

CODE = "import math\nprint(sum(math.isqrt(i) for i in range(2000)))"
TARGET_MS = 30.0


def _timed(fn: Callable[[str], PythonResult]) -> float:
    start = time.perf_counter()
    result = fn(CODE)
    elapsed = time.perf_counter() - start
    if not result.ok:
        raise SystemExit(f"a benchmark tool call failed: {result.error}")
    return elapsed


def _summary(xs: list[float]) -> dict[str, float]:
    ms = [x * 1000 for x in xs]
    return {"min_ms": min(ms), "median_ms": statistics.median(ms), "max_ms": max(ms)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per arm (default 100)")
    parser.add_argument("--episodes", type=int, default=20, help="new-episode calls (default 20)")
    parser.add_argument("--unconfined", action="store_true",
                        help="allow resource limits only where bwrap cannot confine")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    limits = InterpreterLimits(allow_unconfined=args.unconfined)
    conf = confine.enforce(limits.allow_unconfined, "benchmark tool code")
    pool = ToolWorkers(limits)
    session = pool.session()
    cold_call = functools.partial(run_python, limits=limits)
    _timed(session.run)  # the worker is started and warm
    _timed(cold_call)

    warm: list[float] = []
    cold: list[float] = []
    for _ in range(args.calls):  # interleaved, so machine noise lands on both arms
        warm.append(_timed(session.run))
        cold.append(_timed(cold_call))
    session.end()

    first: list[float] = []
    for _ in range(args.episodes):
        time.sleep(0.1)  # the time between episodes, in which the next spare starts
        episode = pool.session()
        first.append(_timed(episode.run))
        episode.end()
    pool.close()

    report = {
        "sandbox": conf.describe(),
        "calls": args.calls,
        "warm": _summary(warm),
        "cold": _summary(cold),
        "episode_first_call": _summary(first),
        "target_ms": TARGET_MS,
    }
    report["warm_under_target"] = report["warm"]["median_ms"] < TARGET_MS
    if args.json:
        print(json.dumps(report))
        return
    print(f"sandbox: {report['sandbox']}")
    print(f"{args.calls} calls per arm; code: {CODE!r}")
    for name, label in (("warm", "warm worker"), ("cold", "cold process"),
                        ("episode_first_call", "episode's first call")):
        row = report[name]
        print(f"{label:>22}: min {row['min_ms']:6.1f} ms  median {row['median_ms']:6.1f} ms  "
              f"max {row['max_ms']:6.1f} ms")
    verdict = "meets" if report["warm_under_target"] else "misses"
    print(f"warm median {report['warm']['median_ms']:.1f} ms {verdict} the {TARGET_MS:g} ms target; "
          f"{report['cold']['median_ms'] / report['warm']['median_ms']:.0f}x faster than cold")


if __name__ == "__main__":
    main()
