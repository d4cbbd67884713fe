"""The UI-cost benchmark replays a recorded run into the real app: every event arrives, in
order, at the recorded pace, and the app draws them (the view ends where the run ended)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import ui_replay  # noqa: E402

from whale_lab.events import EpisodeFinished, RunFinished, RunStarted  # noqa: E402
from whale_lab.store import RunStore  # noqa: E402


class _Store:
    def __init__(self) -> None:
        self.emitted: list[object] = []

    def emit(self, event: object) -> None:
        self.emitted.append(event)


def test_the_replay_keeps_order_and_scales_the_recorded_pace(monkeypatch) -> None:
    events = [
        EpisodeFinished(phase="weight", task_id=f"t{i}", sample=0, turns=1, reward=1.0,
                        stop_reason="answered", ts=100.0 + 2.0 * i)
        for i in range(4)
    ]
    slept: list[float] = []
    clock = [0.0]

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(ui_replay.time, "sleep", sleep)
    monkeypatch.setattr(ui_replay.time, "monotonic", lambda: clock[0])
    store = _Store()
    ui_replay.ReplayEngine(events, store, speed=4.0).run()
    assert store.emitted == events
    assert slept == pytest.approx([0.5, 0.5, 0.5])  # 2 s apart, four times faster


def test_a_size_is_read_as_width_by_height() -> None:
    assert ui_replay._size("80x24") == (80, 24)
    with pytest.raises(Exception, match="WIDTHxHEIGHT"):
        ui_replay._size("eighty")


def test_a_replayed_run_reaches_the_app_whole(tmp_path: Path) -> None:
    source = RunStore(tmp_path / "recorded")
    source.emit(RunStarted(run_id="recorded", domain="math", model="m", schedule="whale",
                           harness="h0", ts=1.0))
    for i in range(30):
        source.emit(EpisodeFinished(phase="weight", task_id=f"t{i}", sample=0, turns=1,
                                    reward=float(i % 2), stop_reason="answered",
                                    ts=1.0 + 0.01 * i))
    source.emit(RunFinished(status="completed", ts=1.4))
    source.close()
    (tmp_path / "replay").mkdir()
    result = ui_replay.replay_round(tmp_path / "recorded", tmp_path / "replay", (100, 30), 4.0)
    assert result["events"] == 32
    assert result["ui_cpu_s"] > 0
    replayed = RunStore.read_events(tmp_path / "replay" / "run")
    assert [type(e) for e in replayed] == [type(e) for e in RunStore.read_events(source.root)]
