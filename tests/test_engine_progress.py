"""The engine tells how far its work has come, and when a command took effect.

`ActivityProgress` for every evaluation split and every candidate's scoring (paced, so a long
evaluation does not fill events.jsonl), the weight phase's step count in `PhaseStarted`, the
plan in `RunStarted`, and `CommandApplied` when a pause, resume or switch actually acts.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from engine_support import ApproveAll, ParityDomain, engine_config

from whale_lab.backends import make_backend
from whale_lab.context import EpisodeSink, ProgressSink, with_progress
from whale_lab.engine.engine import Engine
from whale_lab.engine.safepoints import SafePoints
from whale_lab.events import (
    ActivityProgress,
    CommandApplied,
    CommandReceived,
    Event,
    Log,
    PhaseEnded,
    PhaseStarted,
    RunStarted,
    WeightStep,
)
from whale_lab.seams import Command, CommandChannel
from whale_lab.store import RunStore
from whale_lab.trace import EpisodeTrace, TurnRecord


def run_engine(tmp: Path, commands: CommandChannel | None = None, **sections: Any) -> list[Event]:
    cfg = engine_config(tmp, **sections)
    store = RunStore(tmp / "run")
    events: list[Event] = []
    store.subscribe(events.append)
    engine = Engine(
        cfg,
        store,
        reviewer=ApproveAll(),
        commands=commands or CommandChannel(),
        backend=make_backend(cfg),
        domain=ParityDomain(),
    )
    if commands is not None:

        def on_event(ev: Event) -> None:
            if isinstance(ev, WeightStep) and ev.step == 1:
                commands.send(Command("switch", by="tester", reason="enough"))

        store.subscribe(on_event)
    engine.run()
    store.close()
    return events


def test_every_scoring_reports_its_progress_and_the_plan_is_announced(tmp_path: Path) -> None:
    events = run_engine(tmp_path)
    (started,) = [e for e in events if isinstance(e, RunStarted)]
    assert [(p["cycle"], p["kind"]) for p in started.plan] == [
        (1, "weight"),
        (1, "harness"),
        (2, "weight"),
    ]
    plan_line = next(e.message for e in events if isinstance(e, Log) and "plan:" in e.message)
    assert "the run ends on a weight phase" in plan_line
    # the weight phase knows its steps, and the steps it ran match
    weight = [e for e in events if isinstance(e, PhaseStarted) and e.phase == "weight"]
    assert weight and all(e.steps > 0 for e in weight)
    first = [s for s in events if isinstance(s, WeightStep) and s.cycle == 1]
    assert len(first) == weight[0].steps
    progress = [e for e in events if isinstance(e, ActivityProgress)]
    evals = [e for e in progress if e.activity == "eval"]
    scoring = [e for e in progress if e.activity == "scoring"]
    assert {e.label for e in evals} >= {"val", "test"}
    assert scoring, "no candidate scoring reported its progress"
    # each scoring is announced at its start and closed at its end; the incoming harness and
    # its noise-floor repeat are scored interleaved (labels c000 and c000-repeat), so their
    # reports alternate: each label's reports are followed on their own
    runs: list[list[ActivityProgress]] = []
    current: dict[tuple[str, str], list[ActivityProgress]] = {}
    for e in progress:
        key = (e.activity, e.label)
        if e.done == 0 or key not in current:
            current[key] = []
            runs.append(current[key])
        current[key].append(e)
    assert any(label.endswith("-repeat") for _, label in current)
    for run in runs:
        assert run[0].done == 0 and run[-1].done == run[-1].total > 0
        assert [e.done for e in run] == sorted(e.done for e in run)
        assert len(run) <= run[-1].total + 1


def test_a_switch_says_when_it_took_effect(tmp_path: Path) -> None:
    events = run_engine(tmp_path, commands=CommandChannel(), schedule={"weight_epochs": 1.0})
    kinds = [
        (type(e).__name__, getattr(e, "command", getattr(e, "reason", "")))
        for e in events
        if isinstance(e, CommandReceived | CommandApplied | PhaseEnded)
    ]
    received = kinds.index(("CommandReceived", "switch"))
    applied = kinds.index(("CommandApplied", "switch"))
    ended = kinds.index(("PhaseEnded", "switch"))
    assert received < applied < ended


def test_a_pause_says_when_the_engine_paused_and_resumed() -> None:
    commands = CommandChannel()
    emitted: list[Event] = []
    points = SafePoints(
        commands, emitted.append, validate_probe=lambda cmd: None, run_probe=lambda: None
    )
    points.set("running")
    commands.send(Command("pause", by="tester"))

    def resume_soon() -> None:
        while not any(isinstance(e, CommandApplied) for e in emitted):
            threading.Event().wait(0.01)
        commands.send(Command("resume", by="tester"))

    helper = threading.Thread(target=resume_soon)
    helper.start()
    assert points.interrupt_phase() is False  # paused there, then resumed: the phase goes on
    helper.join(5)
    order = [
        (type(e).__name__, e.command)
        for e in emitted
        if isinstance(e, CommandReceived | CommandApplied)
    ]
    assert order == [
        ("CommandReceived", "pause"),
        ("CommandApplied", "pause"),
        ("CommandReceived", "resume"),
        ("CommandApplied", "resume"),
    ]


class _Writer:
    def __init__(self) -> None:
        self.lines = 0

    def append(self, rec: dict[str, Any]) -> int:
        self.lines += 1
        return self.lines - 1


def _trace(i: int) -> EpisodeTrace:
    turn = TurnRecord(
        prompt=[], response="4", finish_reason="stop", prompt_tokens=3, completion_tokens=4
    )
    return EpisodeTrace(task_id=f"t{i}", sample=0, domain="math", harness="h", turns=[turn])


def test_progress_is_paced_however_fast_episodes_finish() -> None:
    emitted: list[Event] = []
    sink = EpisodeSink(_Writer(), "traces/x.jsonl", emitted.append, phase="eval", harness="h0")  # type: ignore[arg-type]
    wrapped = with_progress(sink, "val", 1000)
    assert isinstance(wrapped, ProgressSink)
    for i in range(1000):
        wrapped(_trace(i))
    reports = [e for e in emitted if isinstance(e, ActivityProgress)]
    assert len([e for e in emitted if not isinstance(e, ActivityProgress)]) == 1000
    assert reports[0].done == 0 and reports[-1].done == 1000 and reports[-1].tokens == 7000
    assert len(reports) <= 4  # start, end, and at most one every half second
    assert {(e.activity, e.label, e.total) for e in reports} == {("eval", "val", 1000)}


def test_only_a_run_sink_reports_progress() -> None:
    def plain(trace: EpisodeTrace) -> None:
        return None

    assert with_progress(plain, "val", 10) is plain
    quiet = EpisodeSink(_Writer(), "x", None, phase="eval", harness="h0")  # type: ignore[arg-type]
    assert with_progress(quiet, "val", 10) is quiet
    assert with_progress(None, "val", 10) is None
