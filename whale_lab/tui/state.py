"""The TUI's view model: a pure reducer from engine events to what the panels show.

Keeping this free of Textual means a live run (events from the engine thread) and a run folder
replayed from `events.jsonl` go through the very same code, so reopening a run shows the same
thing. Nothing here imports textual, torch or the engine.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.events import (
    CandidateProposed,
    CandidateScored,
    CandidateValidated,
    CheckpointSaved,
    CommandReceived,
    EpisodeFinished,
    EvalResult,
    Event,
    HarnessAccepted,
    Log,
    PhaseEnded,
    PhaseProgress,
    PhaseStarted,
    ProbeResult,
    ProposerUsage,
    ReviewDecided,
    ReviewRequested,
    RunFinished,
    RunStarted,
    SteerDelivered,
    SteerNoted,
    WeightStep,
    event_from_dict,
)
from whale_lab.store import read_jsonl, read_jsonl_line
from whale_lab.trace import EpisodeTrace
from whale_lab.tui.progress import ActivityView

#: Stop reasons that end an episode without a verdict on the answer itself.
FAILURE_REASONS = ("format_failure", "illegal_moves", "turn_cap", "token_cap")
ERROR_REASONS = ("harness_error", "backend_error")

#: Areas of the screen a reduced event can change; the app refreshes only those.
AREAS = ("status", "rollouts", "accuracy", "reviews", "control", "log")

MAX_EPISODES = 20_000
MAX_LOGS = 2_000


class RunFolderError(ValueError):
    """A run folder that cannot be shown; the message names the path and what is wrong."""


def outcome(reward: float, stop_reason: str) -> str:
    """Classify an episode for colouring: success, wrong, failure (a cap or budget) or error."""
    if stop_reason in ERROR_REASONS:
        return "error"
    if reward > 0.5:
        return "success"
    if stop_reason in FAILURE_REASONS:
        return "failure"
    return "wrong"


@dataclass(frozen=True)
class EpisodeRow:
    index: int
    cycle: int
    phase: str
    task_id: str
    sample: int
    turns: int
    reward: float
    stop_reason: str
    tokens: int
    harness: str
    trace_path: str
    trace_line: int

    @property
    def outcome(self) -> str:
        return outcome(self.reward, self.stop_reason)


def matches_filter(row: EpisodeRow, flt: str) -> bool:
    """`all`, `failures` (anything that did not succeed) or `stop:<reason>`."""
    if flt == "all":
        return True
    if flt == "failures":
        return row.outcome != "success"
    if flt.startswith("stop:"):
        return row.stop_reason == flt[5:]
    return True


def filter_label(flt: str) -> str:
    if flt.startswith("stop:"):
        return flt[5:]
    return flt


@dataclass(frozen=True)
class EvalPoint:
    split: str
    cycle: int
    phase: str
    mean_at_k: float
    pass_at_k: float
    k: int
    n_tasks: int
    harness: str
    rollouts: int  # weight + harness rollouts consumed when it was measured (0 if unknown)


@dataclass
class CycleRow:
    cycle: int
    weight_budget: float = 0.0
    weight_done: float = 0.0
    weight_unit: str = "epochs"
    harness_budget: float = 0.0
    harness_done: float = 0.0
    harness_unit: str = "iterations"
    weight_rollouts: int = 0
    harness_rollouts: int = 0
    accepted: str = ""
    accepted_score: float | None = None
    val: float | None = None
    test: float | None = None


@dataclass
class ReviewEntry:
    candidate_id: str
    diff: str
    hypothesis: str
    surface: str
    smoke_success: float | None = None
    cited_traces: tuple[str, ...] = ()
    status: str = "pending"  # "pending" | "approve" | "reject" | "edit" | "pin"
    reason: str = ""
    by: str = ""
    cycle: int = 0
    iteration: int = 0
    parent_id: str = ""
    proposer: str = ""
    noise_floor: str = ""
    transcript: str = ""


@dataclass
class SteerEntry:
    """A steer note and where it went: "noted" until a proposer session takes it."""

    note_id: str
    text: str
    by: str = ""
    status: str = "noted"  # "noted" | "applied" | "not applicable"
    cycle: int = 0
    iteration: int = 0
    proposer: str = ""
    detail: str = ""


@dataclass
class CandidateInfo:
    candidate_id: str
    cycle: int
    iteration: int
    parent_id: str
    hypothesis: str
    surface: str
    proposer: str
    valid: bool | None = None
    reason: str = ""
    smoke_success: float | None = None
    success_rate: float | None = None
    status: str = "proposed"


@dataclass(frozen=True)
class LogLine:
    ts: float
    level: str
    message: str


@dataclass
class RunView:
    """Everything the panels show, built by `apply`-ing events in order."""

    run_id: str = ""
    domain: str = ""
    model: str = ""
    schedule: str = ""
    base_harness: str = ""
    harness: str = ""  # the harness in use (the accepted one once there is one)
    resumed: bool = False
    # phase
    cycle: int = 0
    phase: str = ""
    phase_active: bool = False
    phase_budget: float = 0.0
    phase_done: float = 0.0
    phase_unit: str = ""
    last_phase_end: str = ""
    # accounting
    weight_rollouts: int = 0
    harness_rollouts: int = 0
    other_rollouts: int = 0  # eval, probe, smoke runs
    proposer_prompt_tokens: int = 0
    proposer_completion_tokens: int = 0
    proposer_cost: float = 0.0
    proposer_seconds: float = 0.0
    # time
    first_ts: float | None = None
    last_ts: float | None = None
    segment_start: float | None = None
    closed_seconds: float = 0.0
    # control
    started: bool = False
    starts: int = 0  # RunStarted events seen: one per engine session
    finished: str = ""  # "" while running; else RunFinished.status
    finished_message: str = ""
    best: dict[str, Any] = field(default_factory=dict)
    paused: bool = False
    stopping: bool = False
    probe_running: bool = False
    commands: deque[str] = field(default_factory=lambda: deque(maxlen=50))
    probes: list[ProbeResult] = field(default_factory=list)
    # content
    episodes: deque[EpisodeRow] = field(default_factory=lambda: deque(maxlen=MAX_EPISODES))
    episode_count: int = 0
    stop_counts: Counter[str] = field(default_factory=Counter)
    outcome_counts: Counter[str] = field(default_factory=Counter)
    evals: list[EvalPoint] = field(default_factory=list)
    # (cycle, phase, weight + harness rollouts when it ended): phase boundaries on the plot
    phase_marks: list[tuple[int, str, int]] = field(default_factory=list)
    cycles: dict[int, CycleRow] = field(default_factory=dict)
    weight_steps: list[WeightStep] = field(default_factory=list)  # current weight phase only
    # the last weight sync check: "verified" | "unverified" | "skipped" ("" before any)
    weight_sync: str = ""
    weight_sync_note: str = ""
    last_checkpoint: str = ""
    candidates: dict[str, CandidateInfo] = field(default_factory=dict)
    reviews: dict[str, ReviewEntry] = field(default_factory=dict)
    steer_notes: dict[str, SteerEntry] = field(default_factory=dict)
    logs: deque[LogLine] = field(default_factory=lambda: deque(maxlen=MAX_LOGS))
    log_count: int = 0
    event_count: int = 0
    activity: ActivityView = field(default_factory=ActivityView)  # progress, rates, ETAs

    # ------------------------------------------------------------------ derived

    @property
    def pending_reviews(self) -> list[ReviewEntry]:
        return [r for r in self.reviews.values() if r.status == "pending"]

    @property
    def state(self) -> str:
        """One word for the header badge."""
        if self.finished:
            return self.finished
        if not self.started:
            return "waiting"
        if self.stopping:
            return "stopping"
        if self.paused:
            return "paused"
        return "running"

    def elapsed(self, now: float | None = None) -> float:
        """Seconds the engine has been running, summed over every (re)start of the run."""
        total = self.closed_seconds
        if self.segment_start is not None:
            end = now if now is not None else (self.last_ts or self.segment_start)
            total += max(0.0, end - self.segment_start)
        return total

    def cycle_row(self, cycle: int) -> CycleRow:
        if cycle not in self.cycles:
            self.cycles[cycle] = CycleRow(cycle)
        return self.cycles[cycle]

    def weight_series(self) -> tuple[list[float], list[float]]:
        """Training reward and accept rate over the current weight phase."""
        return (
            [s.train_reward for s in self.weight_steps],
            [s.accept_rate for s in self.weight_steps],
        )

    # ------------------------------------------------------------------ reducer

    def apply(self, event: Event) -> set[str]:
        """Fold one event into the view; return the areas that changed."""
        self.event_count += 1
        ts = float(getattr(event, "ts", 0.0) or 0.0)
        prev_ts = self.last_ts
        if isinstance(event, RunStarted) and self.segment_start is not None:
            # A new start without a RunFinished before it: the earlier session ended abruptly,
            # so its time ends at the last event it wrote.
            end = prev_ts if prev_ts is not None else self.segment_start
            self.closed_seconds += max(0.0, end - self.segment_start)
            self.segment_start = None
        if ts:
            if self.first_ts is None:
                self.first_ts = ts
            self.last_ts = max(self.last_ts or ts, ts)
        moved = self.activity.apply(event)
        handler = _HANDLERS.get(type(event))
        changed: set[str] = handler(self, event) if handler is not None else set()
        return changed | {"status"} if moved else changed

    def apply_all(self, events: list[Event]) -> set[str]:
        changed: set[str] = set()
        for ev in events:
            changed |= self.apply(ev)
        return changed

    def _close_segment(self) -> None:
        if self.segment_start is not None:
            end = self.last_ts or self.segment_start
            self.closed_seconds += max(0.0, end - self.segment_start)
            self.segment_start = None

    def _run_started(self, ev: RunStarted) -> set[str]:
        self.segment_start = ev.ts
        self.run_id, self.domain, self.model = ev.run_id, ev.domain, ev.model
        self.schedule = ev.schedule
        if not self.base_harness:
            self.base_harness = ev.harness
        if not self.harness or not ev.resumed:
            self.harness = ev.harness
        self.resumed = self.resumed or ev.resumed
        self.started = True
        self.starts += 1
        self.finished = ""
        self.finished_message = ""
        self.paused = self.stopping = self.probe_running = False
        self._log(ev.ts, "info", f"run {'resumed' if ev.resumed else 'started'}: {ev.run_id}")
        return {"status", "control", "log"}

    def _phase_started(self, ev: PhaseStarted) -> set[str]:
        # a phase resumed after a stop goes on from what it had done, not from 0
        resumed = (ev.cycle, ev.phase) == (self.cycle, self.phase) and not any(
            (c, p) == (ev.cycle, ev.phase) for c, p, _ in self.phase_marks
        )
        row = self.cycle_row(ev.cycle)
        done = 0.0
        if resumed:
            done = row.weight_done if ev.phase == "weight" else row.harness_done
        self.cycle, self.phase = ev.cycle, ev.phase
        self.phase_active = True
        self.phase_budget, self.phase_done, self.phase_unit = ev.budget, done, ev.budget_unit
        if ev.phase == "weight":
            row.weight_budget, row.weight_unit = ev.budget, ev.budget_unit
            self.weight_steps = []
        elif ev.phase == "harness":
            row.harness_budget, row.harness_unit = ev.budget, ev.budget_unit
        if ev.harness:
            self.harness = ev.harness
        unit = ev.budget_unit
        self._log(
            ev.ts, "info", f"cycle {ev.cycle}: {ev.phase} phase started ({ev.budget:g} {unit})"
        )
        return {"status", "accuracy", "control", "log"}

    def _phase_progress(self, ev: PhaseProgress) -> set[str]:
        if ev.cycle == self.cycle and ev.phase == self.phase:
            self.phase_done, self.phase_budget = ev.done, ev.budget
        row = self.cycle_row(ev.cycle)
        if ev.phase == "weight":
            row.weight_done = ev.done
        elif ev.phase == "harness":
            row.harness_done = ev.done
        return {"status", "accuracy"}

    def _phase_ended(self, ev: PhaseEnded) -> set[str]:
        if ev.cycle == self.cycle and ev.phase == self.phase:
            self.phase_active = False
        self.last_phase_end = ev.reason
        self.weight_rollouts = max(self.weight_rollouts, ev.weight_rollouts)
        self.harness_rollouts = max(self.harness_rollouts, ev.harness_rollouts)
        self.phase_marks.append((ev.cycle, ev.phase, self.weight_rollouts + self.harness_rollouts))
        self._log(ev.ts, "info", f"cycle {ev.cycle}: {ev.phase} phase ended ({ev.reason})")
        return {"status", "accuracy", "control", "log"}

    def _run_finished(self, ev: RunFinished) -> set[str]:
        self._close_segment()
        self.finished, self.finished_message, self.best = ev.status, ev.message, dict(ev.best)
        self.phase_active = False
        self.paused = self.stopping = self.probe_running = False
        level = "error" if ev.status == "failed" else "info"
        self._log(ev.ts, level, f"run {ev.status}" + (f": {ev.message}" if ev.message else ""))
        return {"status", "control", "log", "accuracy"}

    def _episode(self, ev: EpisodeFinished) -> set[str]:
        row = EpisodeRow(
            index=self.episode_count,
            cycle=self.cycle,
            phase=ev.phase,
            task_id=ev.task_id,
            sample=ev.sample,
            turns=ev.turns,
            reward=ev.reward,
            stop_reason=ev.stop_reason,
            tokens=ev.tokens,
            harness=ev.harness,
            trace_path=ev.trace_path,
            trace_line=ev.trace_line,
        )
        self.episode_count += 1
        self.episodes.append(row)
        self.stop_counts[ev.stop_reason] += 1
        self.outcome_counts[row.outcome] += 1
        cyc = self.cycle_row(self.cycle)
        if ev.phase == "weight":
            self.weight_rollouts += 1
            cyc.weight_rollouts += 1
        elif ev.phase == "harness":
            self.harness_rollouts += 1
            cyc.harness_rollouts += 1
        else:
            self.other_rollouts += 1
        return {"rollouts", "status"}

    def _eval(self, ev: EvalResult) -> set[str]:
        self.weight_rollouts = max(self.weight_rollouts, ev.weight_rollouts)
        self.harness_rollouts = max(self.harness_rollouts, ev.harness_rollouts)
        self.evals.append(
            EvalPoint(
                split=ev.split,
                cycle=ev.cycle,
                phase=ev.phase,
                mean_at_k=ev.mean_at_k,
                pass_at_k=ev.pass_at_k,
                k=ev.k,
                n_tasks=ev.n_tasks,
                harness=ev.harness,
                rollouts=ev.weight_rollouts + ev.harness_rollouts,
            )
        )
        row = self.cycle_row(ev.cycle)
        if ev.split == "val":
            row.val = ev.mean_at_k
        elif ev.split == "test":
            row.test = ev.mean_at_k
        self._log(
            ev.ts,
            "info",
            f"eval {ev.split} (cycle {ev.cycle}, {ev.phase}): mean@{ev.k} {ev.mean_at_k:.3f}",
        )
        return {"accuracy", "status", "log"}

    def _weight_step(self, ev: WeightStep) -> set[str]:
        self.weight_steps.append(ev)
        sync = str(getattr(ev, "sync", "") or "")
        if sync:
            self.weight_sync = sync
            self.weight_sync_note = str(getattr(ev, "sync_note", "") or "")
            return {"accuracy", "status"}
        return {"accuracy"}

    def _checkpoint(self, ev: CheckpointSaved) -> set[str]:
        self.last_checkpoint = ev.path
        tag = " (best)" if ev.best else ""
        self._log(ev.ts, "info", f"checkpoint step {ev.step}{tag}: {ev.path}")
        return {"log"}

    def _proposed(self, ev: CandidateProposed) -> set[str]:
        self.candidates[ev.candidate_id] = CandidateInfo(
            candidate_id=ev.candidate_id,
            cycle=ev.cycle,
            iteration=ev.iteration,
            parent_id=ev.parent_id,
            hypothesis=ev.hypothesis,
            surface=ev.surface,
            proposer=ev.proposer,
        )
        self._log(ev.ts, "info", f"candidate {ev.candidate_id} ({ev.surface}): {ev.hypothesis}")
        return {"log"}

    def _validated(self, ev: CandidateValidated) -> set[str]:
        cand = self.candidates.get(ev.candidate_id)
        if cand is not None:
            cand.valid, cand.reason, cand.smoke_success = ev.valid, ev.reason, ev.smoke_success
            cand.status = "valid" if ev.valid else "invalid"
        if not ev.valid:
            self._log(ev.ts, "warning", f"candidate {ev.candidate_id} invalid: {ev.reason}")
            return {"log"}
        return set()

    def _review_requested(self, ev: ReviewRequested) -> set[str]:
        cand = self.candidates.get(ev.candidate_id)
        self.reviews[ev.candidate_id] = ReviewEntry(
            candidate_id=ev.candidate_id,
            diff=ev.diff,
            hypothesis=ev.hypothesis,
            surface=ev.surface,
            smoke_success=ev.smoke_success,
            cited_traces=tuple(ev.cited_traces),
            cycle=cand.cycle if cand else self.cycle,
            iteration=cand.iteration if cand else 0,
            parent_id=cand.parent_id if cand else "",
            proposer=cand.proposer if cand else "",
            noise_floor=str(getattr(ev, "noise_floor", "") or ""),
            transcript=str(getattr(ev, "transcript", "") or ""),
        )
        return {"reviews", "status"}

    def _review_decided(self, ev: ReviewDecided) -> set[str]:
        entry = self.reviews.get(ev.candidate_id)
        if entry is not None:
            entry.status, entry.reason, entry.by = ev.decision, ev.reason, ev.by
        cand = self.candidates.get(ev.candidate_id)
        if cand is not None:
            cand.status = ev.decision
        why = f": {ev.reason}" if ev.reason else ""
        self._log(ev.ts, "info", f"review {ev.candidate_id}: {ev.decision} by {ev.by}{why}")
        return {"reviews", "status", "log"}

    def _scored(self, ev: CandidateScored) -> set[str]:
        cand = self.candidates.get(ev.candidate_id)
        if cand is not None:
            cand.success_rate, cand.status = ev.success_rate, ev.status
        return set()

    def _accepted(self, ev: HarnessAccepted) -> set[str]:
        self.harness = ev.candidate_id
        row = self.cycle_row(ev.cycle)
        row.accepted, row.accepted_score = ev.candidate_id, ev.success_rate
        pin = " (pinned)" if ev.pinned else ""
        self._log(
            ev.ts, "info", f"harness accepted{pin}: {ev.candidate_id} success {ev.success_rate:.3f}"
        )
        return {"status", "accuracy", "log"}

    def _usage(self, ev: ProposerUsage) -> set[str]:
        self.proposer_prompt_tokens += ev.prompt_tokens
        self.proposer_completion_tokens += ev.completion_tokens
        self.proposer_cost += ev.cost
        self.proposer_seconds += ev.seconds
        return {"status"}

    def _command(self, ev: CommandReceived) -> set[str]:
        if ev.command == "pause":
            self.paused = True
        elif ev.command == "resume":
            self.paused = False
        elif ev.command == "stop":
            self.stopping, self.paused = True, False
        elif ev.command == "probe":
            self.probe_running = True
        self.commands.append(ev.command)
        why = f" ({ev.reason})" if ev.reason else ""
        self._log(ev.ts, "info", f"command {ev.command} by {ev.by}{why}")
        return {"status", "control", "log"}

    def _steer_noted(self, ev: SteerNoted) -> set[str]:
        self.steer_notes[ev.note_id] = SteerEntry(ev.note_id, ev.text, ev.by)
        self._log(ev.ts, "info", f"steer note {ev.note_id} by {ev.by}: {ev.text}")
        return {"reviews", "log"}

    def _steer_delivered(self, ev: SteerDelivered) -> set[str]:
        entry = self.steer_notes.setdefault(ev.note_id, SteerEntry(ev.note_id, ""))
        entry.status = "applied" if ev.applied else "not applicable"
        entry.cycle, entry.iteration, entry.proposer = ev.cycle, ev.iteration, ev.proposer
        entry.detail = ev.detail
        self._log(
            ev.ts,
            "info",
            f"steer note {ev.note_id} -> cycle {ev.cycle} iteration {ev.iteration} "
            f"({ev.proposer}): {ev.detail}",
        )
        return {"reviews", "log"}

    def _probe(self, ev: ProbeResult) -> set[str]:
        self.probes.append(ev)
        self.probe_running = False
        self._log(ev.ts, "info", f"probe: {ev.recommendation}")
        return {"control", "log"}

    def _logev(self, ev: Log) -> set[str]:
        self._log(ev.ts, ev.level, ev.message)
        return {"log"}

    def _log(self, ts: float, level: str, message: str) -> None:
        self.logs.append(LogLine(ts, level, message))
        self.log_count += 1


_HANDLERS: dict[type, Any] = {
    RunStarted: RunView._run_started,
    PhaseStarted: RunView._phase_started,
    PhaseProgress: RunView._phase_progress,
    PhaseEnded: RunView._phase_ended,
    RunFinished: RunView._run_finished,
    EpisodeFinished: RunView._episode,
    EvalResult: RunView._eval,
    WeightStep: RunView._weight_step,
    CheckpointSaved: RunView._checkpoint,
    CandidateProposed: RunView._proposed,
    CandidateValidated: RunView._validated,
    ReviewRequested: RunView._review_requested,
    ReviewDecided: RunView._review_decided,
    CandidateScored: RunView._scored,
    HarnessAccepted: RunView._accepted,
    ProposerUsage: RunView._usage,
    CommandReceived: RunView._command,
    ProbeResult: RunView._probe,
    SteerNoted: RunView._steer_noted,
    SteerDelivered: RunView._steer_delivered,
    Log: RunView._logev,
}


# ---------------------------------------------------------------------- run folders


def load_run_events(run_dir: str | Path) -> list[Event]:
    """Every event of a run folder, in order; a clear `RunFolderError` when it is not one."""
    root = Path(run_dir)
    if not root.exists():
        raise RunFolderError(f"{root}: run folder not found")
    if not root.is_dir():
        raise RunFolderError(f"{root}: not a folder")
    path = root / "events.jsonl"
    if not path.exists():
        raise RunFolderError(f"{root}: not a run folder (no events.jsonl)")
    out: list[Event] = []
    for rec in read_jsonl(path):
        if isinstance(rec, dict):
            ev = event_from_dict(rec)
            if ev is not None:
                out.append(ev)
    return out


def replay(events: list[Event]) -> RunView:
    view = RunView()
    view.apply_all(events)
    return view


def resolve_trace_path(run_root: str | Path | None, trace_path: str) -> Path | None:
    """Where an episode's trace file is: absolute, relative to the run folder, or to the cwd."""
    if not trace_path:
        return None
    p = Path(trace_path)
    if p.is_absolute():
        return p
    if run_root is not None:
        candidate = Path(run_root) / p
        if candidate.exists():
            return candidate
    return p if p.exists() else (Path(run_root) / p if run_root is not None else p)


def load_trace(run_root: str | Path | None, row: EpisodeRow) -> EpisodeTrace:
    """Read one episode's full trace from the run folder; `RunFolderError` says what is missing."""
    path = resolve_trace_path(run_root, row.trace_path)
    if path is None or row.trace_line < 0:
        raise RunFolderError(f"episode {row.task_id}#{row.sample} has no trace recorded")
    if not path.exists():
        raise RunFolderError(f"{path}: trace file not found")
    rec = read_jsonl_line(path, row.trace_line)
    if rec is None:
        raise RunFolderError(f"{path}: no line {row.trace_line} (the file may be truncated)")
    try:
        return EpisodeTrace.from_dict(rec)
    except TypeError as exc:
        raise RunFolderError(f"{path}:{row.trace_line}: not an episode trace ({exc})") from None
