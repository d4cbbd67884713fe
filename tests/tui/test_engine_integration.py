"""The app on the real engine: a short harness-search run on the embedded micro model, where
one candidate is approved and another rejected through key presses."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale_lab.config import load_config
from whale_lab.events import ReviewDecided, RunFinished
from whale_lab.store import read_json
from whale_lab.tui.app import WhaleLabApp
from whale_lab.tui.screens import ReasonScreen, TraceScreen
from whale_lab.tui.state import load_run_events, replay

pytest.importorskip("whale_lab.engine.engine")

pytestmark = pytest.mark.slow

SETTINGS = [
    "schedule.kind=harness-only",
    "schedule.total_harness_iterations=2",
    "harness_search.candidates_per_iteration=2",
    "harness_search.smoke_tasks=2",
    "domain.splits.weight=8",
    "domain.splits.harness=4",
    "domain.splits.val=4",
    "domain.splits.test=4",
    "sampling.k=1",
    "sampling.max_new_tokens=24",
    "approval.mode=manual",
]


async def test_review_a_real_run_by_keys(tmp_path: Path, wait_for) -> None:
    cfg = load_config(None, [f"run.directory={tmp_path}", *SETTINGS])
    app = WhaleLabApp(cfg, flush_interval=0.05)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(app.reviewer.pending()) == 1, timeout=120)
        first = app.reviewer.pending()[0].candidate_id
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("approve", ()) is True)
        await pilot.press("a")
        await wait_for(
            pilot,
            lambda: any(i.candidate_id != first for i in app.reviewer.pending()),
            timeout=120,
        )
        second = app.reviewer.pending()[0].candidate_id
        await wait_for(pilot, lambda: app.check_action("reject", ()) is True)
        await pilot.press("r")
        assert isinstance(app.screen, ReasonScreen)
        await pilot.press(*"noisy", "enter")
        await wait_for(pilot, lambda: not app.engine_running, timeout=120)
        app.flush_now()
        assert not app.engine_error, app.engine_error
        # a trace of the live run opens from its run folder
        await pilot.press("1", "o")
        assert isinstance(app.screen, TraceScreen)
        await pilot.press("escape")
        root = app.run_root
    assert root is not None
    events = load_run_events(root)
    decided = [
        (e.candidate_id, e.decision, e.reason) for e in events if isinstance(e, ReviewDecided)
    ]
    assert decided == [(first, "approve", "approved in review"), (second, "reject", "noisy")]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"]
    cands = root / "harness_phases" / "cycle-01" / "candidates"
    assert read_json(cands / first / "decision.json")["decision"] == "approve"
    assert read_json(cands / second / "decision.json")["reason"] == "noisy"
    assert replay(events) == app.view
