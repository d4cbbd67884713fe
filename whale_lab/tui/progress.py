"""What the engine is doing right now, how fast, and how long it has left: a pure reducer.

`ActivityView` folds the same events as `state.RunView` (which holds one and feeds it every
event), so a replayed run folder shows what a live one showed. It knows the phase plan
(`RunStarted.plan`), the weight phase's steps (`PhaseStarted.steps`), the scoring under way
(`ActivityProgress`), whether a proposer session is running (a harness iteration ended and the
next one's candidates have not arrived), episodes per second and tokens per second over the
last `RATE_WINDOW` seconds, and estimates of the time left in the phase and in the run.
Nothing here imports textual.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from whale_lab.events import (
    ActivityProgress,
    CandidateProposed,
    CandidateScored,
    CommandApplied,
    CommandReceived,
    EpisodeFinished,
    EvalResult,
    Event,
    PhaseEnded,
    PhaseProgress,
    PhaseStarted,
    ProposerUsage,
    RunFinished,
    RunStarted,
    WeightStep,
)

RATE_WINDOW = 30.0  # seconds of event time the throughput figures cover


@dataclass(frozen=True)
class Activity:
    """The scoring or proposing under way: `val 96/256`, `scoring c1-i2-a 12/64`."""

    kind: str  # "eval" | "scoring" | "proposer"
    label: str
    done: int = 0
    total: int = 0
    seconds: float = 0.0

    def text(self) -> str:
        if self.kind == "proposer":
            return f"proposer session ({self.label})"
        name = self.label if self.kind == "eval" else f"scoring {self.label}"
        return f"{name} {self.done}/{self.total}" if self.total else name

    @property
    def left_seconds(self) -> float | None:
        if self.kind == "proposer" or not self.done or not self.total or self.seconds <= 0:
            return None
        return (self.total - self.done) * self.seconds / self.done


@dataclass
class ActivityView:
    plan: list[dict[str, Any]] = field(default_factory=list)
    harness_source: str = ""
    activity: Activity | None = None
    # set by the app: an engine is running now (rates and time left mean something)
    live: bool = field(default=False, compare=False)
    # the weight phase
    phase: str = ""
    cycle: int = 0
    in_phase: bool = False
    steps: int = 0
    start_step: int = 0
    step: int = 0
    phase_ts: float = 0.0
    # time per unit of work, measured: (seconds, units) per kind, and per evaluation point
    _last_unit_ts: float = 0.0
    spent: dict[str, list[float]] = field(
        default_factory=lambda: {"weight": [0.0, 0.0], "harness": [0.0, 0.0], "eval": [0.0, 0.0]}
    )
    steps_per_epoch: float = 0.0
    ended: set[tuple[int, str]] = field(default_factory=set)
    # the last harness iteration done, per (cycle): a resumed phase keeps its count
    iteration_done: dict[int, float] = field(default_factory=dict)
    harness_budget: float = 0.0
    # commands the engine has acted on
    paused: bool = False  # a pause took effect (CommandApplied), no resume or stop since
    switches: int = 0  # switches that took effect
    _episodes: deque[tuple[float, int]] = field(default_factory=deque)

    # ------------------------------------------------------------------ derived
    def rates(self, now: float) -> tuple[float, float] | None:
        """(episodes/s, tokens/s) over the last `RATE_WINDOW` seconds; None with none."""
        recent = [(ts, tok) for ts, tok in self._episodes if ts >= now - RATE_WINDOW]
        if len(recent) < 2:
            return None
        span = max(1.0, now - recent[0][0])
        return len(recent) / span, sum(tok for _, tok in recent) / span

    def weight_step_text(self) -> str:
        if not self.steps:
            return ""
        return f"step {max(0, self.step - self.start_step)}/{self.steps}"

    def _rate(self, kind: str) -> float | None:
        seconds, units = self.spent[kind]
        return seconds / units if units > 0 else None

    def phase_left(self, phase: str, done: float, budget: float) -> float | None:
        """Seconds left in the phase under way (None until one unit of it was timed)."""
        if phase == "weight" and self.steps:
            per = self._rate("weight")
            left = self.steps - max(0, self.step - self.start_step)
            return None if per is None else max(0, left) * per
        if phase == "harness":
            per = self._rate("harness")
            return None if per is None else max(0.0, budget - done) * per
        return None

    def run_left(self, phase: str, done: float, budget: float, active: bool) -> float | None:
        """Seconds left in the run: what is left of this phase, the plan's phases not begun, and
        one evaluation point after each (None until each kind of work left was timed)."""
        if not self.plan:
            return None
        total = 0.0
        points = 0
        if active and phase in ("weight", "harness"):
            left = self.phase_left(phase, done, budget)
            if left is None:
                return None
            total += left
            points += 1
        current = (self.cycle, phase) if active else None
        for spec in self.plan:
            key = (int(spec.get("cycle", 0)), str(spec.get("kind", "")))
            if key in self.ended or key == current:
                continue
            kind, units = key[1], float(spec.get("budget", 0.0))
            if kind == "weight":
                units = units * self.steps_per_epoch
            per = self._rate(kind)
            if per is None or (kind == "weight" and not self.steps_per_epoch):
                return None
            total += units * per
            points += 1
        if points:
            per_point = self._rate("eval")
            if per_point is None:
                return None
            total += points * per_point
        return total

    # ------------------------------------------------------------------ reducer
    def apply(self, ev: Event) -> bool:
        """Fold one event in; True when what the header shows may have changed."""
        handler = _HANDLERS.get(type(ev))
        return bool(handler(self, ev)) if handler is not None else False

    def _run_started(self, ev: RunStarted) -> bool:
        if ev.plan:
            self.plan = [dict(p) for p in ev.plan]
        self.harness_source = ev.harness_source or self.harness_source
        self.activity, self.paused, self.in_phase = None, False, False
        self._last_unit_ts = 0.0
        return True

    def _phase_started(self, ev: PhaseStarted) -> bool:
        self.phase, self.cycle, self.phase_ts = ev.phase, ev.cycle, ev.ts
        self.in_phase = True
        self._last_unit_ts = ev.ts
        if ev.phase == "weight":
            self.steps, self.start_step = ev.steps, ev.start_step
            self.step = max(self.step, ev.start_step)
            if ev.steps and ev.budget > 0:
                self.steps_per_epoch = ev.steps / ev.budget
        elif ev.phase == "harness":
            self.harness_budget = ev.budget
            if ev.cycle not in self.iteration_done:
                self.activity = None  # iteration 1 re-scores the incoming harness
        return True

    def _weight_step(self, ev: WeightStep) -> bool:
        self.step = ev.step
        self._unit("weight", ev.ts)
        return True

    def _phase_progress(self, ev: PhaseProgress) -> bool:
        if ev.phase != "harness":
            return False
        self.iteration_done[ev.cycle] = ev.done
        self._unit("harness", ev.ts)
        if ev.done < ev.budget:
            self.activity = Activity("proposer", f"iteration {int(ev.done) + 1}")
        return True

    def _unit(self, kind: str, ts: float) -> None:
        if self._last_unit_ts and ts >= self._last_unit_ts:
            self.spent[kind][0] += ts - self._last_unit_ts
            self.spent[kind][1] += 1
        self._last_unit_ts = ts

    def _phase_ended(self, ev: PhaseEnded) -> bool:
        self.ended.add((ev.cycle, ev.phase))
        self.in_phase = False
        self.activity = None
        self._last_unit_ts = 0.0
        if ev.phase == "weight":
            self.steps = 0
        return True

    def _progress(self, ev: ActivityProgress) -> bool:
        self.activity = Activity(ev.activity, ev.label, ev.done, ev.total, ev.seconds)
        if ev.activity == "eval" and ev.total and ev.done >= ev.total and not self.in_phase:
            # an evaluation point between phases, timed for the run's ETA
            if ev.label == "val":
                self.spent["eval"][1] += 1
            self.spent["eval"][0] += ev.seconds
        return True

    def _episode(self, ev: EpisodeFinished) -> bool:
        self._episodes.append((ev.ts, ev.tokens))
        while self._episodes[0][0] < ev.ts - RATE_WINDOW or len(self._episodes) > 20_000:
            self._episodes.popleft()
        return False

    def _settled(self, ev: Event) -> bool:
        """A result ends the scoring it came from."""
        if self.activity is not None and self.activity.kind != "proposer":
            self.activity = None
            return True
        return False

    def _proposed(self, ev: CandidateProposed) -> bool:
        if self.activity is not None and self.activity.kind == "proposer":
            self.activity = None
            return True
        return False

    def _command(self, ev: CommandReceived) -> bool:
        if ev.command in ("resume", "stop"):
            self.paused = False
        return False

    def _applied(self, ev: CommandApplied) -> bool:
        if ev.command == "pause":
            self.paused = True
        elif ev.command == "resume":
            self.paused = False
        elif ev.command == "switch":
            self.switches += 1
        return True

    def _finished(self, ev: RunFinished) -> bool:
        self.activity, self.paused = None, False
        return True


_HANDLERS: dict[type, Any] = {
    RunStarted: ActivityView._run_started,
    PhaseStarted: ActivityView._phase_started,
    WeightStep: ActivityView._weight_step,
    PhaseProgress: ActivityView._phase_progress,
    PhaseEnded: ActivityView._phase_ended,
    ActivityProgress: ActivityView._progress,
    EpisodeFinished: ActivityView._episode,
    EvalResult: ActivityView._settled,
    CandidateScored: ActivityView._settled,
    CandidateProposed: ActivityView._proposed,
    ProposerUsage: ActivityView._proposed,
    CommandReceived: ActivityView._command,
    CommandApplied: ActivityView._applied,
    RunFinished: ActivityView._finished,
}
