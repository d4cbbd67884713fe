"""A run killed right after an event is written repeats none of its completed events on resume.

The engine runs on the embedded default (micro model, math) in a child process that ends itself
with `os._exit` the moment a chosen event is on disk, which is a kill at the worst instant: the
event is written, the state that says so is not. Resumed in process, the run must finish with
every completed event once: the harness acceptance, the phase ends, the scorings, the evaluations.

Run as a script, this module is that child: `python test_resume_events.py RUN_DIR EVENT_TYPE`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

KILL_CODE = 137


def resume_config(folder: Path) -> Any:
    """A short harness-only run: evaluation at the start, one 2-iteration phase, evaluation."""
    from whale_lab.config import config_from_dict

    return config_from_dict(
        {
            "run": {"directory": str(folder / "runs"), "seed": 3},
            "model": {"path": "micro"},
            "domain": {
                "name": "math",
                "splits": {"weight": 4, "harness": 2, "val": 2, "test": 2},
            },
            "sampling": {"k": 1, "max_new_tokens": 32},
            "rsft": {"prompts_per_step": 2, "samples_per_prompt": 2, "eval_every": 10.0},
            "harness_search": {"candidates_per_iteration": 1, "smoke_tasks": 1},
            "schedule": {"kind": "harness-only", "total_harness_iterations": 2},
            "approval": {"mode": "auto"},
        }
    )


def _child(run_dir: str, kill_on: str) -> None:
    """Run the engine; end the process the moment the first `kill_on` event is written."""
    from whale_lab.engine.engine import create_run
    from whale_lab.reviewers import AutoReviewer
    from whale_lab.seams import CommandChannel

    cfg = resume_config(Path(run_dir).parent)
    engine, store = create_run(cfg, run_dir, reviewer=AutoReviewer(), commands=CommandChannel())

    def kill(ev: Any) -> None:
        if ev.type == kill_on:  # already appended to events.jsonl: listeners run after the write
            os._exit(KILL_CODE)

    store.subscribe(kill)
    engine.run()
    os._exit(0)  # the event never came


def _kill_at(run_dir: Path, kill_on: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, __file__, str(run_dir), kill_on],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert proc.returncode == KILL_CODE, proc.stderr[-3000:]


def _resume(run_dir: Path) -> list[Any]:
    from whale_lab.engine.engine import open_engine
    from whale_lab.reviewers import AutoReviewer
    from whale_lab.seams import CommandChannel
    from whale_lab.store import RunStore

    engine, store = open_engine(
        resume_config(run_dir.parent), str(run_dir), reviewer=AutoReviewer(),
        commands=CommandChannel(),
    )
    engine.run()
    store.close()
    return RunStore.read_events(run_dir)


def _repeated(events: list[Any]) -> dict[str, dict[Any, int]]:
    """Completed events that occur more than once, by kind and identity."""
    keys = {
        "harness_accepted": lambda e: (e.cycle, e.candidate_id),
        "phase_ended": lambda e: (e.cycle, e.phase),
        "candidate_scored": lambda e: e.candidate_id,
        "candidate_validated": lambda e: e.candidate_id,
        "eval_result": lambda e: (e.checkpoint, e.split),
        "weight_step": lambda e: e.step,
    }
    out = {}
    for kind, key in keys.items():
        counts = Counter(key(e) for e in events if e.type == kind)
        many = {k: n for k, n in counts.items() if n > 1}
        if many:
            out[kind] = many
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kill_on", ["harness_accepted", "phase_ended"])
def test_a_kill_right_after_an_event_repeats_nothing_on_resume(
    tmp_path: Path, kill_on: str
) -> None:
    from whale_lab.store import RunStore

    run_dir = tmp_path / "run"
    _kill_at(run_dir, kill_on)
    before = RunStore.read_events(run_dir)
    assert before[-1].type == kill_on
    accepted = [e.candidate_id for e in before if e.type == "harness_accepted"]
    assert len(accepted) == 1

    events = _resume(run_dir)
    assert [e.type for e in events if e.type == "run_finished"] == ["run_finished"]
    assert [e.status for e in events if e.type == "run_finished"] == ["completed"]
    assert [e.candidate_id for e in events if e.type == "harness_accepted"] == accepted
    assert _repeated(events) == {}
    assert [e.phase for e in events if e.type == "phase_ended"] == ["harness"]
    assert not (run_dir / "engine.lock").exists()


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
