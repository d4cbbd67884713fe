"""How long the embedded default takes to put its first candidate up for review.

Runs `whale.toml` as the app would (a new run, manual approval) and prints, as JSON, the wall
seconds from the start to each phase start and to the first review request; the run is stopped
there. `--switch-at-start` sends `switch` as soon as the first weight phase starts, which is what
the first-run panel's skip-ahead key does.

    OMP_NUM_THREADS=1 python benchmarks/first_review.py [--switch-at-start] [--timeout 1200]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from whale_lab.config import load_config
from whale_lab.engine.runs import open_engine
from whale_lab.events import Event, PhaseStarted
from whale_lab.seams import Command, CommandChannel, ReviewDecision, ReviewItem

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(REPO / "whale.toml"))
    ap.add_argument("--switch-at-start", action="store_true")
    ap.add_argument("--timeout", type=float, default=1200.0)
    args = ap.parse_args()
    cfg = load_config(args.config)
    tmp = tempfile.mkdtemp(prefix="whale-first-review-")
    cfg = cfg.replace(run=dataclasses.replace(cfg.run, directory=tmp))
    commands = CommandChannel()
    seen: dict[str, float] = {}
    reviewed = threading.Event()
    t0 = time.monotonic()

    class FirstReview:
        """Records the first request and leaves it pending, so the run stops there."""

        def review(self, item: ReviewItem) -> ReviewDecision:
            seen.setdefault("first review", round(time.monotonic() - t0, 1))
            reviewed.set()
            commands.send(Command("stop", by="benchmark"))
            return ReviewDecision("pending")

    engine, store = open_engine(cfg, None, reviewer=FirstReview(), commands=commands)

    def listen(ev: Event) -> None:
        if isinstance(ev, PhaseStarted):
            seen.setdefault(f"{ev.phase} phase {ev.cycle}", round(time.monotonic() - t0, 1))
            if args.switch_at_start and ev.phase == "weight" and ev.cycle == 1:
                commands.send(Command("switch", by="benchmark"))

    store.subscribe(listen)
    worker = threading.Thread(target=engine.run, daemon=True)
    worker.start()
    reviewed.wait(args.timeout)
    if not reviewed.is_set():
        commands.send(Command("stop", by="benchmark", reason="timeout"))
    worker.join(120)
    out: dict[str, Any] = {
        "switch_at_start": args.switch_at_start,
        "seconds": seen,
        "reached_review": reviewed.is_set(),
        "load_average": Path("/proc/loadavg").read_text().split()[:3]
        if Path("/proc/loadavg").exists()
        else None,
        "run": str(store.root),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
