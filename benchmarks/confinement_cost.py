"""What OS confinement costs: one math tool call, and a whole math eval, confined against unconfined.

Both arms run in one process, alternated over several rounds (confined, unconfined, confined, ...),
so machine noise lands on both. Tool calls are timed by wall clock and by CPU seconds of this
process plus its children (the interpreter runs in a child); the eval by wall clock and CPU.

    python benchmarks/confinement_cost.py --rounds 3 --calls 20 --tasks 8 --k 2

Targets (issue "untrusted code confined by the operating system"): at most 0.15 s extra per tool
call and at most 5% of rollout wall time on the default math eval.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from whale_lab import confine
from whale_lab.domains.interpreter import InterpreterLimits, run_python

CODE = "import math\nprint(sum(math.isqrt(i) for i in range(2000)))"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - w0, _cpu() - c0


def _set_confined(on: bool, real: confine.Confinement) -> None:
    confine._detected = real if on else confine.Confinement(False, reason="benchmark arm")
    confine._warned = True


def _tool_calls(n: int, limits: InterpreterLimits) -> None:
    for _ in range(n):
        if not run_python(CODE, limits).ok:
            raise SystemExit("a benchmark tool call failed")


def _eval(tasks: int, k: int) -> Callable[[], None]:
    from whale_lab.backends import make_backend
    from whale_lab.config import load_config
    from whale_lab.context import Evaluator
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import default_harness_path, sampling_params

    cfg = load_config(
        None,
        [
            "domain.name=math",
            f"domain.splits.val={tasks}",
            "sandbox.allow_unconfined=true",
            "model.path=micro",
        ],
    )
    backend, domain = make_backend(cfg), make_domain(cfg)
    evaluator = Evaluator.from_config(cfg, backend, domain)
    val = domain.tasks("val")
    harness = default_harness_path(cfg)

    def run() -> None:
        evaluator.score(harness, val, k, sampling_params(cfg, cfg.run.seed))

    return run


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    real = confine.detect()
    if not real.confined:
        raise SystemExit(f"nothing to compare: {real.describe()}")
    limits = InterpreterLimits(allow_unconfined=True)
    evaluate = _eval(args.tasks, args.k)
    for on in (True, False):  # warm both arms
        _set_confined(on, real)
        _tool_calls(2, limits)
        evaluate()
    extra_call_s: list[float] = []
    call_cpu_ratio: list[float] = []
    eval_wall_ratio: list[float] = []
    eval_cpu_ratio: list[float] = []
    for _ in range(args.rounds):
        arms: dict[bool, dict[str, tuple[float, float]]] = {}
        for on in (True, False):
            _set_confined(on, real)
            arms[on] = {
                "calls": _timed(lambda: _tool_calls(args.calls, limits)),
                "eval": _timed(evaluate),
            }
        extra_call_s.append((arms[True]["calls"][0] - arms[False]["calls"][0]) / args.calls)
        call_cpu_ratio.append(arms[True]["calls"][1] / max(arms[False]["calls"][1], 1e-9))
        eval_wall_ratio.append(arms[True]["eval"][0] / arms[False]["eval"][0])
        eval_cpu_ratio.append(arms[True]["eval"][1] / max(arms[False]["eval"][1], 1e-9))
    _set_confined(True, real)
    out = {
        "confinement": real.describe(),
        "rounds": args.rounds,
        "extra_wall_s_per_tool_call": _summary(extra_call_s),
        "tool_call_cpu_ratio": _summary(call_cpu_ratio),
        "eval_wall_ratio_confined_over_unconfined": _summary(eval_wall_ratio),
        "eval_cpu_ratio_confined_over_unconfined": _summary(eval_cpu_ratio),
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(out["confinement"])
    for key in list(out)[2:]:
        s = out[key]
        print(f"{key}: min {s['min']:.4f}  median {s['median']:.4f}  max {s['max']:.4f}")


if __name__ == "__main__":
    main()
