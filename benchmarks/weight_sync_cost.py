"""What the weight-sync check costs against one RSFT weight step (target: under 5%).

One weight phase on the given model and domain (default: the micro model on math, the default
`rsft`/`sampling` settings, the hf backend in process). Each round runs both arms, in alternating
order: a whole weight step (rollouts, accept, update, publish) with the check switched off, and the
check alone (keeping the previous weights plus probing the backend and scoring under the new and
previous weights), as it runs after every publish. Times are CPU seconds of this process
(`time.process_time`); the ratio is median check / median step.

    python benchmarks/weight_sync_cost.py                       # micro, math, 5 rounds
    python benchmarks/weight_sync_cost.py --rounds 7 --prompts-per-step 4
    python benchmarks/weight_sync_cost.py --model tiny-random --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _summary(xs: list[float]) -> dict[str, float]:
    return {
        "min": round(min(xs), 4),
        "median": round(statistics.median(xs), 4),
        "max": round(max(xs), 4),
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from whale_lab.backends import make_backend
    from whale_lab.config import config_from_dict
    from whale_lab.context import RunContext
    from whale_lab.domains import make_domain
    from whale_lab.store import RunStore
    from whale_lab.weights.rsft import RsftPhase
    from whale_lab.weights.sync import SKIPPED, SyncResult

    data: dict[str, Any] = {
        "run": {"seed": args.seed},
        "model": {"path": args.model, "device": args.device},
        "domain": {"name": args.domain},
    }
    if args.prompts_per_step:
        data["rsft"] = {"prompts_per_step": args.prompts_per_step}
    cfg = config_from_dict(data)
    harness = REPO / "harnesses" / args.domain / "h0.py"
    out: dict[str, Any] = {"model": args.model, "domain": args.domain, "rounds": args.rounds}
    with tempfile.TemporaryDirectory() as tmp:
        backend = make_backend(cfg)
        domain = make_domain(cfg)
        store = RunStore(Path(tmp) / "run")
        phase = RsftPhase(RunContext.of(cfg, backend, domain, store, lambda _e: None))
        host = phase._open_host(harness)
        name = str(host.info.name)
        real_verify = phase._verify

        def no_check(*, adapter: str, baseline: bool) -> SyncResult:
            return SyncResult(status=SKIPPED, served_version=phase.served_version)

        # The phase's bookkeeping (history, resume points) as `run` sets it up.
        phase._phase = {
            "start_step": 0,
            "start_drawn": 0,
            "target_steps": None,
            "epochs": None,
            "harness": str(harness),
            "history": [],
        }
        steps: list[float] = []
        checks: list[float] = []
        results: list[str] = []
        updates = 0

        def step_arm() -> None:
            nonlocal updates
            phase._verify = no_check  # type: ignore[method-assign]
            t0 = time.process_time()
            ev = phase._step(host, name, None)
            steps.append(time.process_time() - t0)
            phase._verify = real_verify  # type: ignore[method-assign]
            updates += int(ev is not None and ev.loss is not None)

        def check_arm() -> None:
            t0 = time.process_time()
            phase.sync.remember()  # what `update` does before each SFT pass
            res = phase.sync.check(backend, served_version=phase.served_version)
            checks.append(time.process_time() - t0)
            results.append(res.status)

        try:
            step_arm()  # warm-up: first-call costs (kernels, caches) are not a step's cost
            check_arm()
            steps.clear()
            checks.clear()
            results.clear()
            updates = 0
            for r in range(args.rounds):
                arms = (step_arm, check_arm) if r % 2 == 0 else (check_arm, step_arm)
                for arm in arms:
                    arm()
        finally:
            host.close()
            backend.close()
    out["step_cpu_s"] = _summary(steps)
    out["check_cpu_s"] = _summary(checks)
    out["updates"] = updates
    out["check_statuses"] = results
    out["ratio"] = round(statistics.median(checks) / statistics.median(steps), 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="micro")
    ap.add_argument("--domain", default="math", choices=("math", "chess", "search"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts-per-step", type=int, default=0, help="0: the config default")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    r = measure(args)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    s, c = r["step_cpu_s"], r["check_cpu_s"]
    print(f"model {r['model']} on {r['domain']}, {r['rounds']} rounds, arms alternating, CPU s")
    print(f"  weight step (no check)  min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f}")
    print(f"  sync check              min {c['min']:.3f}  median {c['median']:.3f}  max {c['max']:.3f}")
    print(f"  steps that updated the weights: {r['updates']} of {r['rounds']}")
    print(f"  ratio (median check / median step): {r['ratio']:.2%}   (target < 5%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
