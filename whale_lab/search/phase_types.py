"""What a harness phase reports: after each iteration (to `stop_when`) and at its end."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PhaseStatus:
    """What `stop_when` sees after each iteration (the adaptive schedule's patience rule)."""

    iteration: int
    iterations: int
    best_id: str | None
    best_success: float | None
    history: tuple[float, ...]  # best success in the archive after each completed iteration
    new_best: bool
    rollouts: int


@dataclass(frozen=True)
class PhaseResult:
    status: str  # "completed" | "stopped" | "pending"
    reason: str  # "budget" | "patience" | "stop" | "pending"
    accepted_id: str | None
    accepted_path: str
    success_rate: float | None
    mean_turns: float | None
    pinned: bool
    iterations_done: int
    harness_rollouts: int
    archive_dir: str
    pending: tuple[str, ...] = ()
    history: tuple[float, ...] = ()
    proposer_usage: dict[str, float] = field(default_factory=dict)
