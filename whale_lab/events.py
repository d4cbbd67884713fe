"""Plain, frozen event records: the only thing the engine tells the world.

The engine calls `emit(event)`; the store appends it to `runs/<id>/events.jsonl`; the TUI, the
headless CLI and the tests each subscribe. `event_from_dict` reads them back for replay.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

EVENT_TYPES: dict[str, type[Event]] = {}


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    ts: float = field(default_factory=time.time, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        EVENT_TYPES[cls.type] = cls

    def to_dict(self) -> dict[str, Any]:
        d = {"type": self.type}
        for f in dataclasses.fields(self):
            d[f.name] = _plain(getattr(self, f.name))
        return d


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def event_from_dict(d: dict[str, Any]) -> Event | None:
    """Rebuild an event; unknown types or fields (from a newer version) give None, not a crash."""
    cls = EVENT_TYPES.get(str(d.get("type")))
    if cls is None:
        return None
    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in d.items():
        if k in names:
            kwargs[k] = tuple(v) if isinstance(v, list) and "tuple" in str(names[k].type) else v
    try:
        return cls(**kwargs)
    except TypeError:
        return None


Emit = Callable[[Event], None]


# ------------------------------------------------------------------ run & phases


@dataclass(frozen=True)
class RunStarted(Event):
    type: ClassVar[str] = "run_started"
    run_id: str
    domain: str
    model: str
    schedule: str
    harness: str
    config: dict[str, Any] = field(default_factory=dict)
    resumed: bool = False
    # the phase plan ({"cycle", "kind", "budget", "unit"} each) and where the base harness came
    # from (relative to the working directory where it can be)
    plan: tuple[dict[str, Any], ...] = ()
    harness_source: str = ""


@dataclass(frozen=True)
class PhaseStarted(Event):
    type: ClassVar[str] = "phase_started"
    cycle: int
    phase: str  # "weight" | "harness" | "eval" | "probe"
    budget: float  # epochs for weight, iterations for harness
    budget_unit: str  # "epochs" | "iterations" | "tasks"
    harness: str = ""
    steps: int = 0  # weight phases: the optimiser steps the budget makes (0 where unknown)
    start_step: int = 0  # weight phases: the run's step count when the phase began


@dataclass(frozen=True)
class PhaseProgress(Event):
    type: ClassVar[str] = "phase_progress"
    cycle: int
    phase: str
    done: float
    budget: float


@dataclass(frozen=True)
class PhaseEnded(Event):
    type: ClassVar[str] = "phase_ended"
    cycle: int
    phase: str
    reason: str  # "budget" | "patience" | "switch" | "stop"
    weight_rollouts: int = 0
    harness_rollouts: int = 0


@dataclass(frozen=True)
class ActivityProgress(Event):
    """How far the scoring under way has come: an evaluation split or a candidate's rollouts.

    Emitted when it begins, then at most twice a second, and when it ends, so a long
    evaluation shows its progress without filling events.jsonl.
    """

    type: ClassVar[str] = "activity_progress"
    activity: str  # "eval" | "scoring"
    label: str  # the split ("val") or the candidate ("c1-i2-a")
    done: int
    total: int
    tokens: int = 0  # of the episodes finished so far
    seconds: float = 0.0  # since it began


@dataclass(frozen=True)
class CommandApplied(Event):
    """A command took effect: the engine paused at a safe point, resumed, or ended a phase on a
    switch. `CommandReceived` says when it arrived; this says when it acted."""

    type: ClassVar[str] = "command_applied"
    command: str  # "pause" | "resume" | "switch"
    detail: str = ""


@dataclass(frozen=True)
class RunFinished(Event):
    type: ClassVar[str] = "run_finished"
    status: str  # "completed" | "stopped" | "failed"
    message: str = ""
    best: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ rollouts


@dataclass(frozen=True)
class EpisodeFinished(Event):
    """A compact summary; the full trace lives in the run folder at `trace_path`, line `trace_line`."""

    type: ClassVar[str] = "episode_finished"
    phase: str
    task_id: str
    sample: int
    turns: int
    reward: float
    stop_reason: str
    tokens: int = 0
    harness: str = ""
    trace_path: str = ""
    trace_line: int = -1


@dataclass(frozen=True)
class EvalResult(Event):
    type: ClassVar[str] = "eval_result"
    split: str
    cycle: int
    phase: str
    mean_at_k: float
    pass_at_k: float
    k: int
    n_tasks: int
    harness: str = ""
    checkpoint: str = ""
    weight_rollouts: int = 0
    harness_rollouts: int = 0
    diagnostics: dict[str, float] = field(default_factory=dict)


# ------------------------------------------------------------------ weights


@dataclass(frozen=True)
class WeightStep(Event):
    type: ClassVar[str] = "weight_step"
    cycle: int
    step: int
    epoch: float
    train_reward: float
    accept_rate: float
    kept: int
    loss: float | None
    tokens: int
    grad_norm: float | None
    step_seconds: float
    rollouts: int
    # What the backend generates with after this step, and whether that was checked
    # (weights/sync.py). Defaults keep event files from before these fields readable.
    served_version: str = ""  # "base" or "step-<n>" (the adapter name for adapter backends)
    fingerprint: str = ""  # short hash of the trained tensors behind served_version
    sync: str = ""  # "verified" | "unverified" | "skipped" (nothing published this step)
    sync_distance: float | None = None  # mean |served - trained| log-prob per probe token (nats)
    sync_note: str = ""  # why unverified
    reencoded_turns: int = 0  # trained turns whose target was re-encoded text, not sampled ids


@dataclass(frozen=True)
class CheckpointSaved(Event):
    type: ClassVar[str] = "checkpoint_saved"
    path: str
    step: int
    val_mean_at_k: float | None = None
    best: bool = False


# ------------------------------------------------------------------ harness search


@dataclass(frozen=True)
class CandidateProposed(Event):
    type: ClassVar[str] = "candidate_proposed"
    cycle: int
    iteration: int
    candidate_id: str
    parent_id: str
    hypothesis: str
    surface: str
    proposer: str
    diff: str = ""


@dataclass(frozen=True)
class CandidateValidated(Event):
    type: ClassVar[str] = "candidate_validated"
    candidate_id: str
    valid: bool
    reason: str = ""
    smoke_success: float | None = None


@dataclass(frozen=True)
class ReviewRequested(Event):
    type: ClassVar[str] = "review_requested"
    candidate_id: str
    diff: str
    hypothesis: str
    surface: str
    smoke_success: float | None = None
    cited_traces: tuple[str, ...] = ()
    # what the reviewer should weigh beside the diff: the split's noise floor (paired acceptance)
    # and where the proposer session that wrote the candidate is recorded
    noise_floor: str = ""
    transcript: str = ""


@dataclass(frozen=True)
class ReviewDecided(Event):
    type: ClassVar[str] = "review_decided"
    candidate_id: str
    decision: str  # "approve" | "reject" | "edit" | "pin"
    reason: str = ""
    by: str = "human"


@dataclass(frozen=True)
class CandidateScored(Event):
    type: ClassVar[str] = "candidate_scored"
    candidate_id: str
    success_rate: float
    mean_turns: float
    tokens: int
    rollouts: int
    status: str = "evaluated"  # "evaluated" | "crashed"
    failures: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class HarnessAccepted(Event):
    type: ClassVar[str] = "harness_accepted"
    cycle: int
    candidate_id: str
    success_rate: float
    path: str
    pinned: bool = False


@dataclass(frozen=True)
class ProposerUsage(Event):
    type: ClassVar[str] = "proposer_usage"
    proposer: str
    prompt_tokens: int
    completion_tokens: int
    cost: float
    seconds: float


# ------------------------------------------------------------------ control & probes


@dataclass(frozen=True)
class CommandReceived(Event):
    type: ClassVar[str] = "command_received"
    command: str  # "pause" | "resume" | "switch" | "probe" | "stop"
    by: str = "user"
    reason: str = ""


@dataclass(frozen=True)
class SteerNoted(Event):
    """A reviewer's request in words for the next proposer session (its one record)."""

    type: ClassVar[str] = "steer_noted"
    note_id: str
    text: str
    by: str = "user"


@dataclass(frozen=True)
class SteerDelivered(Event):
    """A steer note reached a proposer session; `applied` is False where the proposer cannot
    read words (the rules catalogue), and `detail` says why."""

    type: ClassVar[str] = "steer_delivered"
    note_id: str
    cycle: int
    iteration: int
    proposer: str
    applied: bool
    detail: str = ""
    archive: str = ""  # the phase archive, relative to the run folder


@dataclass(frozen=True)
class ProbeResult(Event):
    type: ClassVar[str] = "probe_result"
    harness_gain_per_1k: float
    weight_gain_per_1k: float
    recommendation: str
    evidence: tuple[str, ...] = ()
    diagnostics: dict[str, float] = field(default_factory=dict)
    # "harness" | "weights" | "both" | "inconclusive" (paired intervals) | "unclear" (none)
    verdict: str = ""
    # per side: {"gain_per_1k", "interval": [low, high] | None, "verdict", "rollouts", "paired"}
    sides: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InteractionResult(Event):
    """The interaction probe: harness {incumbent, candidate} x weights {before, after} on val."""

    type: ClassVar[str] = "interaction_result"
    verdict: str  # "positive" | "negative" | "inconclusive"
    text: str
    cells: dict[str, float] = field(default_factory=dict)  # "incumbent/before", ... -> mean@k
    # paired results (PairedResult.to_dict): candidate minus incumbent under each weights, and
    # the interaction (gain after minus gain before)
    gain_before: dict[str, Any] = field(default_factory=dict)
    gain_after: dict[str, Any] = field(default_factory=dict)
    interaction: dict[str, Any] = field(default_factory=dict)
    incumbent: str = ""
    candidate: str = ""
    steps: tuple[int, ...] = ()  # the weight steps before and after
    rollouts: int = 0


@dataclass(frozen=True)
class Log(Event):
    type: ClassVar[str] = "log"
    level: str  # "info" | "warning" | "error"
    message: str
