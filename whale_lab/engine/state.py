"""The run's persisted state, typed: `RunState` and one `PhaseRecord` per phase begun.

`state.json` is the engine's truth across kills and resumes. The typed classes read and write
exactly the JSON earlier versions wrote (same keys; optional keys absent until they are set), and
keep any key they do not know, so a run folder round-trips unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

ENGINE_VERSION = 1

_Json = dict[str, Any]


def _from(cls: Any, data: _Json) -> Any:
    """A dataclass from a JSON dict; unknown keys go to `extra`."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    known = {k: v for k, v in data.items() if k in names}
    extra = {k: v for k, v in data.items() if k not in names}
    return cls(**known, extra=extra)


def _to(obj: Any, optional: frozenset[str]) -> _Json:
    out: _Json = {}
    for f in dataclasses.fields(obj):
        if f.name == "extra":
            continue
        value = getattr(obj, f.name)
        if f.name in optional and value is None:
            continue
        out[f.name] = value
    out.update(obj.extra)
    return out


@dataclass
class PhaseRecord:
    """One phase of the plan as far as it got: begun, running, ending, ended."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"start_step", "dir", "end_step", "end_weight_rollouts", "evaluated", "pending",
         "accepted", "switch"}
    )

    index: int
    kind: str  # "weight" | "harness"
    cycle: int
    budget: float
    adaptive: bool
    status: str  # "running" | "ending" | "ended"
    reason: str
    started: float
    incoming: str  # the harness the phase started from (relative to the run folder)
    start_weight_rollouts: int
    start_step: int | None = None  # weight phases
    dir: str | None = None  # harness phases: the phase archive
    end_step: int | None = None
    end_weight_rollouts: int | None = None
    evaluated: bool | None = None
    pending: list[str] | None = None  # candidates awaiting review when the run stopped
    accepted: str | None = None  # harness phases: the harness it ended with
    switch: _Json | None = None  # who ended it early, and why
    extra: _Json = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: _Json) -> PhaseRecord:
        return _from(cls, data)

    def to_dict(self) -> _Json:
        return _to(self, self.OPTIONAL)


def _weights_state() -> _Json:
    return {"rollouts": 0, "eval_rollouts": 0, "step": 0, "updates": 0, "sampler": None}


@dataclass
class RunState:
    """Everything a resumed engine needs; written atomically after every step and transition."""

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"kept_weights_at", "updated"})

    engine_version: int
    run_id: str
    schedule: str
    plan: list[_Json]
    status: str = "new"  # "new" | "running" | "stopped" | "failed" | "completed"
    message: str = ""
    phase_index: int = 0
    phases: list[PhaseRecord] = field(default_factory=list)
    harness: str = ""  # the accepted harness now
    base_harness: str = ""
    base_harness_source: str = ""
    start_eval: bool = False
    checkpoints: dict[str, _Json] = field(default_factory=dict)
    eval_rollouts: int = 0
    last_eval: str | None = None  # identity of the last evaluation point (weights | harness)
    probes: list[_Json] = field(default_factory=list)
    probe_rollouts: int = 0
    probe_usage: _Json = field(default_factory=dict)
    kept_probe_rollouts: int = 0
    kept_harness_rollouts: int = 0
    kept_weights: int = 0
    weights_ref: _Json | None = None
    switches: list[_Json] = field(default_factory=list)
    weights: _Json = field(default_factory=_weights_state)
    ledger: _Json = field(default_factory=dict)
    best: _Json = field(default_factory=dict)
    kept_weights_at: _Json | None = None
    updated: float | None = None
    extra: _Json = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: _Json) -> RunState:
        state: RunState = _from(cls, data)
        state.phases = [
            p if isinstance(p, PhaseRecord) else PhaseRecord.from_dict(p) for p in state.phases
        ]
        return state

    def to_dict(self) -> _Json:
        out = _to(self, self.OPTIONAL)
        out["phases"] = [p.to_dict() for p in self.phases]
        return out

    def record(self, index: int) -> PhaseRecord:
        for rec in self.phases:
            if int(rec.index) == index:
                return rec
        raise KeyError(index)

    def pending(self) -> list[str]:
        return [c for rec in self.phases for c in (rec.pending or [])]
