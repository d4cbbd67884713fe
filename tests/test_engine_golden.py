"""The engine's behaviour pinned: the `whale` schedule on the embedded default with a fixed seed.

The recorded sequence of (event type, phase, cycle, candidate id, step, task, reward, scores) and the key sets of
`state.json` and `result.json` were written by the engine before it was split by concern; any
restructuring must reproduce them exactly. Regenerated since, for intended changes: paired
acceptance scores the incoming harness a second time to measure the noise floor (three more
harness episodes in cycle 1, nothing else moved); test is scored only where val reaches a new
best (`eval.test_every = "best"`: the two weight-phase points lost their test result and its 12
episodes, nothing else moved); the hf backend's continuous batching gives each row its own seeded
sampling stream (the same event types, phases and steps; other sampled rewards); the
selection says which rule chose it (`best.decided_by`, one key more, no event moved); scoring progress
(`activity_progress`, paced by the clock) is left out of the rows like log lines; every prompt is
seeded by its episode (task, sample, turn), and the incoming harness and its noise-floor repeat
are scored in the same waves (other sampled rewards; `candidate_scored c000` after the repeat's
episodes); a weight-phase point that ties the best val is scored on test too (its 6 test episodes
and test result at each of the two tied points, 14 rows); the ledger counts syncs by outcome
(`sync_verified`, `sync_unverified`, `sync_skipped`, `sync_last`); the micro model's second
version, then its third, its fifth and its tenth (each time the same 89 event types in the same
order and the same key sets; other sampled rewards and scores). Regenerate (only for an intended
behaviour change) with

    WHALE_LAB_GOLDEN_WRITE=1 .venv/bin/python -m pytest tests/test_engine_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import config_from_dict
from whale_lab.engine.engine import Engine
from whale_lab.events import Event
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json

GOLDEN = Path(__file__).parent / "fixtures" / "golden" / "whale_micro_math.json"
WRITE = os.environ.get("WHALE_LAB_GOLDEN_WRITE") == "1"
#: Not behaviour: log lines, and scoring progress (its reports are paced by the clock).
UNPINNED = ("log", "activity_progress")


def golden_config(folder: Path) -> Any:
    return config_from_dict(
        {
            "run": {"directory": str(folder / "runs"), "seed": 3},
            "model": {"path": "micro"},
            "domain": {
                "name": "math",
                "splits": {"weight": 8, "harness": 3, "val": 3, "test": 3},
            },
            "sampling": {"k": 2, "max_new_tokens": 48},
            "rsft": {"prompts_per_step": 2, "samples_per_prompt": 2, "eval_every": 0.5},
            "harness_search": {"candidates_per_iteration": 2, "smoke_tasks": 1},
            # equal weight phases (the shipped default shortens only the first, for the app)
            "schedule": {
                "kind": "whale",
                "cycles": 1,
                "weight_epochs": 0.5,
                "first_weight_epochs": 0.0,
                "harness_iterations": 2,
            },
            "approval": {"mode": "auto"},
        }
    )


def _row(ev: Event) -> list[Any]:
    d = ev.to_dict() if hasattr(ev, "to_dict") else dict(vars(ev))
    return [
        d.get("type", ""),
        d.get("phase", ""),
        d.get("cycle", None),
        d.get("candidate_id", ""),
        d.get("step", None),
        d.get("task_id", ""),
        _num(d.get("reward")),
        _num(d.get("mean_at_k")),
        _num(d.get("success_rate")),
        d.get("kept", None),
        d.get("split", ""),
        d.get("decision", ""),
    ]


def _num(v: Any) -> float | None:
    return None if v is None else round(float(v), 6)


def _keys(d: dict[str, Any]) -> list[str]:
    return sorted(d)


def record(folder: Path) -> dict[str, Any]:
    cfg = golden_config(folder)
    store = RunStore(folder / "run")
    events: list[Event] = []
    store.subscribe(events.append)
    engine = Engine(cfg, store, reviewer=AutoReviewer(), commands=CommandChannel())
    engine.run()
    store.close()
    state = read_json(store.root / "state.json")
    result = read_json(store.root / "result.json")
    phases = state.get("phases", [])
    return {
        "events": [_row(e) for e in events if e.type not in UNPINNED],
        "state_keys": _keys(state),
        "phase_keys": [_keys(p) for p in phases],
        "weights_keys": _keys(state["weights"]),
        "result_keys": _keys(result),
        "best_keys": _keys(result["best"]),
        "ledger_keys": _keys(result["ledger"]),
    }


@pytest.mark.timeout(600)
def test_the_whale_schedule_on_the_embedded_default_is_unchanged(tmp_path: Path) -> None:
    got = record(tmp_path)
    if WRITE:
        GOLDEN.write_text(json.dumps(got, indent=1) + "\n", encoding="utf-8")
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert got["state_keys"] == want["state_keys"]
    assert got["phase_keys"] == want["phase_keys"]
    assert got["weights_keys"] == want["weights_keys"]
    assert got["result_keys"] == want["result_keys"]
    assert got["best_keys"] == want["best_keys"]
    assert got["ledger_keys"] == want["ledger_keys"]
    assert got["events"] == want["events"]
