"""SVG snapshots at 80x24 from recorded run folders (no engine, so they are deterministic).

Regenerate after an intended change with:
    pytest tests/tui/test_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

from whale_lab.config import Config
from whale_lab.tui.app import WhaleLabApp

SIZE = (80, 24)


def app_on(run: Path) -> WhaleLabApp:
    return WhaleLabApp(Config(), run_dir=str(run), replay_only=True)


def test_header_and_rollouts(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), terminal_size=SIZE)


def test_accuracy(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["2"], terminal_size=SIZE)


def test_review_queue(snap_compare, interrupted_run) -> None:
    assert snap_compare(app_on(interrupted_run), press=["3"], terminal_size=SIZE)


def test_control_and_probe(snap_compare, fixture_run) -> None:
    assert snap_compare(app_on(fixture_run), press=["4"], terminal_size=SIZE)
