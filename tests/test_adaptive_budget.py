"""An adaptive run's weight phases share the total weight budget and never go past it.

A weight-only run of `total_weight_epochs` takes `round(total x steps per epoch)` steps; the
adaptive schedule's weight phases share that total (`schedules.adaptive_weight_steps`). Before
the fix a phase that found the total spent was still given "at least one step" (math seed 1 in
the README: 13 steps on a 12-step total). Here the rule cannot fire within the budget (window,
patience and minimum of 2 epochs), so the first phase spends the whole total and the last must
take no step.
"""

from __future__ import annotations

from pathlib import Path

from engine_support import ApproveAll, ParityDomain, engine_config

from whale_lab.backends import make_backend
from whale_lab.engine.engine import Engine
from whale_lab.engine.schedules import adaptive_weight_steps
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore


def test_an_adaptive_run_takes_no_more_weight_steps_than_the_total(tmp_path: Path) -> None:
    cfg = engine_config(
        tmp_path,
        schedule={
            "kind": "adaptive",
            "cycles": 1,
            "total_weight_epochs": 1.0,  # 8 prompts, 2 per step: 4 steps
            "window_epochs": 2.0,
            "patience_epochs": 2.0,
            "min_weight_epochs": 2.0,
            "min_harness_iterations": 1,
            "max_harness_iterations": 1,
        },
    )
    store = RunStore(tmp_path / "run")
    engine = Engine(cfg, store, reviewer=ApproveAll(), commands=CommandChannel(),
                    backend=make_backend(cfg), domain=ParityDomain())
    engine.run()
    state = store.read_state()
    store.close()
    weight = [p for p in state["phases"] if p["kind"] == "weight"]
    steps = [int(p["end_step"]) - int(p["start_step"] or 0) for p in weight]
    total = adaptive_weight_steps(1.0, 4, 0)
    assert total == 4
    assert steps[0] == 4  # the rule cannot fire: the budget ends the first phase
    assert sum(steps) <= total, steps
