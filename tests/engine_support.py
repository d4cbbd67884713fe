"""Shared pieces of the engine tests: tiny configs, a recording backend, reviewers, a kill target.

`ParityDomain` (from `rsft_support`) is a genuine domain that the tiny random model passes about
half the time, so RSFT really updates and harness search really has scores to compare. Run as a
script, this module runs an engine on a run folder and prints one line per completed step,
iteration and review request, so a test can SIGKILL it at a chosen point:

    python engine_support.py RUN_DIR (new|resume) (approve|block)
"""

from __future__ import annotations

import hashlib
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from rsft_support import ParityDomain, tiny_config, write_harness  # noqa: E402

from whale_lab.config import Config  # noqa: E402
from whale_lab.events import Event  # noqa: E402
from whale_lab.seams import CommandChannel, ReviewDecision, ReviewItem

__all__ = ["ParityDomain", "write_harness"]

# The SIGKILL test's schedule: weight phases of 4 steps around a 2-iteration harness phase.
KILL_TEST_SCHEDULE: dict[str, Any] = {"kind": "whale", "weight_epochs": 1.0}


def engine_config(folder: Path, **sections: dict[str, Any]) -> Config:
    """Seconds-long runs: 8 weight prompts (2 per step), 2 harness/val/test tasks, k=2."""
    harness = write_harness(folder)
    base: dict[str, dict[str, Any]] = {
        "run": {"directory": str(folder / "runs")},
        "domain": {"harness": str(harness)},
        "schedule": {
            "kind": "whale",
            "cycles": 1,
            "weight_epochs": 0.5,
            "harness_iterations": 2,
            "total_weight_epochs": 0.5,
            "total_harness_iterations": 2,
        },
        "harness_search": {"candidates_per_iteration": 2, "smoke_tasks": 2},
        "approval": {"mode": "auto"},
        # every evaluation point scores val and test, so the engine tests can check the pairs
        # (the default scores test only at new bests on val: tests/test_eval_cost.py)
        "eval": {"test_every": "always"},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return tiny_config(**base)


class ApproveAll:
    """A reviewer that approves every candidate and remembers what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def review(self, item: ReviewItem) -> ReviewDecision:
        self.seen.append(item.candidate_id)
        return ReviewDecision("approve", reason="approved by the test", by="test")


class BlockingReviewer:
    """Announces the candidate, then never answers (the test kills the process)."""

    def review(self, item: ReviewItem) -> ReviewDecision:
        print(f"review {item.candidate_id}", flush=True)
        threading.Event().wait()
        raise AssertionError("unreachable")  # pragma: no cover


class RecordingBackend:
    """The real backend, plus a record of the trainable weights at every generate call.

    Delegates everything to the wrapped backend (RSFT trains the wrapped backend's model in
    place); `calls` holds (phase, digest of the LoRA weights) per generation batch, where the
    phase is read from the engine's status when one is attached.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.engine: Any = None
        self.calls: list[tuple[str, str]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def digest(self) -> str:
        h = hashlib.sha256()
        for name, p in sorted(self.inner.model.named_parameters()):
            if "lora_" in name:
                h.update(p.detach().cpu().numpy().tobytes())
        return h.hexdigest()[:16]

    def generate(self, prompts: Any, params: Any) -> Any:
        phase = self.engine.status().phase if self.engine is not None else ""
        self.calls.append((phase, self.digest()))
        return self.inner.generate(prompts, params)


def lines_of(events: list[Event], kind: str) -> list[Event]:
    return [e for e in events if e.type == kind]


def _main(run_dir: str, mode: str, reviewer_kind: str) -> None:
    """Run an engine on `run_dir`, printing progress lines; the parent test kills it."""
    from whale_lab.backends import make_backend
    from whale_lab.engine.engine import Engine, open_engine
    from whale_lab.store import RunStore

    folder = Path(run_dir).parent
    cfg = engine_config(folder, approval={"mode": "manual"}, schedule=KILL_TEST_SCHEDULE)
    reviewer: Any = ApproveAll() if reviewer_kind == "approve" else BlockingReviewer()
    backend = make_backend(cfg)
    domain = ParityDomain()
    if mode == "new":
        store = RunStore(run_dir)
        engine = Engine(
            cfg, store, reviewer=reviewer, commands=CommandChannel(), backend=backend, domain=domain
        )
    else:
        engine, store = open_engine(
            cfg,
            run_dir,
            reviewer=reviewer,
            commands=CommandChannel(),
            backend=backend,
            domain=domain,
        )

    def show(ev: Event) -> None:
        if ev.type == "weight_step":
            print(f"weight_step {ev.step}", flush=True)  # type: ignore[attr-defined]
        elif ev.type == "phase_progress" and ev.phase == "harness":  # type: ignore[attr-defined]
            print(f"harness_iteration {int(ev.done)}", flush=True)  # type: ignore[attr-defined]
        elif ev.type == "candidate_scored":
            print(f"scored {ev.candidate_id}", flush=True)  # type: ignore[attr-defined]
        elif ev.type == "run_finished":
            print(f"finished {ev.status}", flush=True)  # type: ignore[attr-defined]

    store.subscribe(show)
    engine.run()
    store.close()


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], sys.argv[3])
