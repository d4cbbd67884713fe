"""Fixtures for the TUI tests: the recorded run folder and an engine that replays it.

`ReplayEngine` stands in for the engine in panel tests (the real engine has its own tests): it
emits the recorded event stream through `RunStore.emit`, copies each episode's trace into the new
run folder, asks the reviewer about every review request (and records the real decision instead
of the recorded one), and honours pause / resume / switch / probe / stop at safe points.
"""

from __future__ import annotations

import dataclasses
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import Config
from whale_lab.events import (
    CommandApplied,
    CommandReceived,
    EpisodeFinished,
    Event,
    PhaseEnded,
    PhaseStarted,
    ProbeResult,
    ReviewDecided,
    ReviewRequested,
    RunFinished,
)
from whale_lab.seams import CommandChannel, ReviewDecision, ReviewItem
from whale_lab.store import RunStore, read_jsonl_line
from whale_lab.tui.state import load_run_events

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run"


def recorded_events() -> list[Event]:
    return load_run_events(FIXTURE_RUN)


class ReplayEngine:
    def __init__(
        self,
        events: list[Event],
        store: RunStore,
        reviewer: Any,
        commands: CommandChannel,
        *,
        hold_after: int | None = None,
        ignore_stop: threading.Event | None = None,
        fail_after: int | None = None,
        hold_outside_phase: bool = False,
    ) -> None:
        self.events = events
        self.hold_outside_phase = hold_outside_phase
        self.store = store
        self.reviewer = reviewer
        self.commands = commands
        self.hold_after = hold_after
        self.ignore_stop = ignore_stop
        self.fail_after = fail_after
        self.decisions: list[tuple[str, ReviewDecision]] = []
        self.received: list[str] = []
        self.holding = threading.Event()
        self.release = threading.Event()
        self.paused = False

    def _handle(self, cmd: Any) -> bool:
        """Acknowledge one command; True means stop now."""
        self.received.append(cmd.kind)
        self.store.emit(CommandReceived(command=cmd.kind, by=cmd.by, reason=cmd.reason))
        if cmd.kind == "pause":
            self.paused = True
            self.store.emit(CommandApplied(command="pause", detail="paused at a safe point"))
        elif cmd.kind == "resume":
            self.paused = False
            self.store.emit(CommandApplied(command="resume", detail="resumed"))
        elif cmd.kind == "switch":
            self.store.emit(CommandApplied(command="switch", detail="the phase ended"))
        elif cmd.kind == "probe":
            self.store.emit(
                ProbeResult(
                    harness_gain_per_1k=0.5,
                    weight_gain_per_1k=1.5,
                    recommendation="weights are the bottleneck",
                    evidence=("val rose with weight rollouts",),
                )
            )
        return cmd.kind == "stop"

    def _poll(self) -> bool:
        """One safe point: handle commands, wait while paused; True means stop now."""
        while True:
            for cmd in self.commands.drain():
                if self._handle(cmd):
                    return True
            if not self.paused:
                return False
            time.sleep(0.01)

    def _finish_stopped(self, why: str) -> None:
        self.store.emit(RunFinished(status="stopped", message=why))

    def run(self) -> None:
        if self.ignore_stop is not None:
            self.holding.set()
            self.ignore_stop.wait(30)
            return
        phase: tuple[int, str] | None = None
        for n, ev in enumerate(self.events):
            if self.fail_after is not None and n == self.fail_after:
                raise RuntimeError("CUDA out of memory [bold]while[/bold] generating")
            if self._poll():
                return self._finish_stopped("stop requested")
            if isinstance(ev, ReviewDecided):
                continue
            if isinstance(ev, EpisodeFinished) and ev.trace_path:
                rec = read_jsonl_line(FIXTURE_RUN / ev.trace_path, ev.trace_line)
                name = Path(ev.trace_path).stem
                line = self.store.trace_writer(name).append(rec or {})
                ev = dataclasses.replace(ev, trace_line=line)
            self.store.emit(ev)
            if isinstance(ev, PhaseStarted):
                phase = (ev.cycle, ev.phase)
            if isinstance(ev, PhaseEnded):
                phase = None
            if isinstance(ev, ReviewRequested):
                code = (FIXTURE_RUN / "harnesses" / f"{ev.candidate_id}.py").read_text()
                item = ReviewItem(
                    candidate_id=ev.candidate_id,
                    diff=ev.diff,
                    hypothesis=ev.hypothesis,
                    surface=ev.surface,
                    code=code,
                    smoke_success=ev.smoke_success,
                    cited_traces=ev.cited_traces,
                )
                decision = self.reviewer.review(item)
                if decision.decision == "pending":
                    return self._finish_stopped("stopped while a review was pending")
                self.decisions.append((ev.candidate_id, decision))
                self.store.emit(
                    ReviewDecided(
                        candidate_id=ev.candidate_id,
                        decision=decision.decision,
                        reason=decision.reason,
                        by=decision.by,
                    )
                )
            if self.hold_after is not None and n + 1 == self.hold_after:
                assert phase is not None or self.hold_outside_phase, "hold inside a phase"
                self.holding.set()
                while not self.release.is_set():
                    if self._poll():
                        return self._finish_stopped("stop requested")
                    time.sleep(0.01)


class FakeEngines:
    """An `engine_factory` that builds `ReplayEngine`s and remembers them."""

    def __init__(self, root: Path, **engine_kwargs: Any) -> None:
        self.root = root
        self.engine_kwargs = engine_kwargs
        self.engines: list[ReplayEngine] = []
        self.events = recorded_events()
        self.fail_on_open: Exception | None = None

    def __call__(
        self, cfg: Config, run_dir: str | None, reviewer: Any, commands: CommandChannel
    ) -> tuple[ReplayEngine, RunStore]:
        if self.fail_on_open is not None:
            raise self.fail_on_open
        store = RunStore(run_dir) if run_dir else RunStore.create(self.root, "fake")
        engine = ReplayEngine(self.events, store, reviewer, commands, **self.engine_kwargs)
        self.engines.append(engine)
        return engine, store

    @property
    def engine(self) -> ReplayEngine:
        return self.engines[-1]


@pytest.fixture
def fixture_run(tmp_path: Path) -> Path:
    """A private copy of the recorded run folder."""
    dst = tmp_path / "recorded"
    shutil.copytree(FIXTURE_RUN, dst)
    return dst


@pytest.fixture
def interrupted_run(tmp_path: Path) -> Path:
    """The recorded run cut just after both review requests: no decisions, no RunFinished."""
    dst = tmp_path / "interrupted"
    shutil.copytree(FIXTURE_RUN, dst)
    lines = (FIXTURE_RUN / "events.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    cut = max(i for i, line in enumerate(lines) if '"review_requested"' in line) + 1
    (dst / "events.jsonl").write_text("".join(lines[:cut]), encoding="utf-8")
    return dst


@pytest.fixture
def make_engines(tmp_path: Path) -> Callable[..., FakeEngines]:
    def make(**kwargs: Any) -> FakeEngines:
        return FakeEngines(tmp_path / "runs", **kwargs)

    return make


async def _wait_for(pilot: Any, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.02)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    """`await wait_for(pilot, cond)`: let the app run until cond() holds (10 s at most)."""
    return _wait_for
