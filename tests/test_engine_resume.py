"""A run killed with SIGKILL at several points resumes with nothing lost or repeated.

One run, three processes, each killed: during the first weight phase, while a candidate awaits
review, and during the harness phase after that review. The test then resumes the run in
process and checks weights, sampler position, reviews, candidates and the ledger.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from engine_support import KILL_TEST_SCHEDULE, ApproveAll, ParityDomain, engine_config

from whale_lab.backends import make_backend
from whale_lab.engine.engine import open_engine
from whale_lab.engine.ledger import Ledger
from whale_lab.events import (
    CandidateScored,
    EvalResult,
    ReviewDecided,
    ReviewRequested,
    RunFinished,
    RunStarted,
    WeightStep,
)
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json

SUPPORT = Path(__file__).resolve().parent / "engine_support.py"


def run_until_killed(run_dir: Path, mode: str, reviewer: str, marker: str) -> list[str]:
    """Start the engine in a subprocess; SIGKILL it as soon as it prints `marker`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(SUPPORT), str(run_dir), mode, reviewer],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.strip() == marker:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                assert proc.returncode == -signal.SIGKILL
                return lines
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    raise AssertionError(f"the engine never printed {marker!r}; it printed {lines}")


@pytest.mark.slow
def test_sigkill_at_several_points_then_resume(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # 1. during the first weight phase (4 steps): killed after step 2
    out = run_until_killed(run_dir, "new", "approve", "weight_step 2")
    assert out[:2] == ["weight_step 1", "weight_step 2"]
    # 2. resumed, it finishes the weight phase, then blocks on the first review: killed there
    out = run_until_killed(run_dir, "resume", "block", "review c001")
    assert out[0] == "weight_step 3"  # steps 1-2 were not repeated
    # 3. resumed, the pending review is asked again and approved; killed once c001 is scored
    out = run_until_killed(run_dir, "resume", "approve", "scored c001")
    assert "weight_step 1" not in out

    # 4. resumed in process to the end
    cfg = engine_config(tmp_path, approval={"mode": "manual"}, schedule=KILL_TEST_SCHEDULE)
    reviewer = ApproveAll()
    engine, store = open_engine(
        cfg,
        str(run_dir),
        reviewer=reviewer,
        commands=CommandChannel(),
        backend=make_backend(cfg),
        domain=ParityDomain(),
    )
    engine.run()
    store.close()
    events = RunStore.read_events(run_dir)
    of = lambda cls: [e for e in events if isinstance(e, cls)]  # noqa: E731

    assert [e.resumed for e in of(RunStarted)] == [False, True, True, True]
    assert of(RunFinished)[-1].status == "completed"
    # every completed weight step happened once; both phases' budgets were met
    steps = [e.step for e in of(WeightStep)]
    assert steps == sorted(set(steps)) and steps[-1] == 8
    state = read_json(run_dir / "state.json")
    assert state["weights"]["step"] == 8
    assert state["weights"]["sampler"]["drawn"] == 8 * 2  # the sampler never re-drew a prompt
    # the review left pending by the killed process was asked again and decided once
    requested = Counter(e.candidate_id for e in of(ReviewRequested))
    decided = Counter(e.candidate_id for e in of(ReviewDecided))
    assert requested["c001"] >= 2 and decided["c001"] == 1
    assert all(n == 1 for n in decided.values())
    assert all(n == 1 for n in Counter(e.candidate_id for e in of(CandidateScored)).values())
    archive = read_json(run_dir / "harness_phases/cycle-01/state.json")
    assert archive["finished"] and archive["proposed"] == sorted(set(archive["proposed"]))
    # the ledger is whole: every step's rollouts once, the harness phase's from its archive
    ledger = Ledger.read(run_dir)
    assert ledger.weight_rollouts == 8 * 8
    assert ledger.harness_rollouts == archive["rollouts"]
    assert state["ledger"] == ledger.to_dict()
    val = Counter(e.checkpoint for e in of(EvalResult) if e.split == "val")
    test = Counter(e.checkpoint for e in of(EvalResult) if e.split == "test")
    assert set(val) == set(test)
    assert not (run_dir / "engine.lock").exists()
