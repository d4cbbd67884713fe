"""Schedules: which phases run, in what order, with what budgets and stopping rules.

A schedule is a list of `PhaseSpec`s fixed at the start (so a resumed run knows where it is);
the adaptive schedule's phases carry stopping rules that end them early. `best-of-n` is the
control for search: harness-only's phase and proposal budget, its candidates drawn from the
rules catalogue at random without reading any score (`search.proposers.rules.draw`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

from whale_lab.config import ScheduleConfig

PhaseKind = Literal["weight", "harness"]
SCHEDULES = (
    "whale",
    "adaptive",
    "weight-only",
    "harness-only",
    "stagewise",
    "prompt-only",
    "best-of-n",
)


@dataclass(frozen=True)
class PhaseSpec:
    kind: PhaseKind
    cycle: int
    budget: float  # epochs of the weight split, or harness iterations
    adaptive: bool = False
    prompt_only: bool = False
    draws: bool = False  # candidates drawn at random from the catalogue, no search (best-of-n)

    @property
    def unit(self) -> str:
        return "epochs" if self.kind == "weight" else "iterations"


def plan(cfg: ScheduleConfig) -> list[PhaseSpec]:
    """The phase sequence. Alternating schedules end after a weight phase, as WHALE does."""
    kind = cfg.kind
    if kind == "weight-only":
        return [PhaseSpec("weight", 1, cfg.total_weight_epochs)]
    if kind == "harness-only":
        return [PhaseSpec("harness", 1, float(cfg.total_harness_iterations))]
    if kind == "best-of-n":
        return [PhaseSpec("harness", 1, float(cfg.total_harness_iterations), draws=True)]
    if kind == "stagewise":
        return [
            PhaseSpec("weight", 1, cfg.total_weight_epochs),
            PhaseSpec("harness", 1, float(cfg.total_harness_iterations)),
        ]
    if kind in ("whale", "prompt-only"):
        prompt_only = kind == "prompt-only"
        phases: list[PhaseSpec] = []
        for c in range(1, cfg.cycles + 1):
            first = c == 1 and cfg.first_weight_epochs > 0
            epochs = cfg.first_weight_epochs if first else cfg.weight_epochs
            phases.append(PhaseSpec("weight", c, epochs))
            phases.append(
                PhaseSpec("harness", c, float(cfg.harness_iterations), prompt_only=prompt_only)
            )
        phases.append(PhaseSpec("weight", cfg.cycles + 1, cfg.weight_epochs))
        return phases
    if kind == "adaptive":
        # Budgets are caps; the stopping rules end phases earlier. The total weight budget is
        # shared: the engine gives each weight phase at most what earlier ones left of it, and
        # `max_phase_weight_epochs` (when set) caps one phase on top.
        cap = cfg.max_phase_weight_epochs or cfg.total_weight_epochs
        per_weight = min(cap, cfg.total_weight_epochs)
        phases = []
        for c in range(1, cfg.cycles + 1):
            phases.append(PhaseSpec("weight", c, per_weight, adaptive=True))
            phases.append(PhaseSpec("harness", c, float(cfg.max_harness_iterations), adaptive=True))
        phases.append(PhaseSpec("weight", cfg.cycles + 1, per_weight, adaptive=True))
        return phases
    raise ValueError(f"schedule.kind: unknown schedule {kind!r}")  # config validation prevents this


def proposal_budget(cfg: ScheduleConfig, candidates_per_iteration: int) -> int:
    """Candidates a schedule's harness phases may ask for: every iteration but each phase's first
    (which re-scores the incoming harness) asks for `candidates_per_iteration`. Adaptive phases
    may stop earlier, so for them this is a cap. Comparisons hold this equal across schedules."""
    return sum(
        max(0, int(round(p.budget)) - 1) * candidates_per_iteration
        for p in plan(cfg)
        if p.kind == "harness"
    )


def adaptive_weight_steps(
    total_epochs: float,
    steps_per_epoch: float,
    used_steps: int,
    cap_epochs: float = 0.0,
) -> int:
    """Steps an adaptive weight phase may take: what the earlier weight phases left of the shared
    total, capped by `max_phase_weight_epochs` when set; 0 when the total is spent.

    Counted in whole steps, the total rounded as a fixed schedule rounds it
    (`RsftPhase.steps_for`), so the adaptive phases of a run sum to at most the steps a
    weight-only run of the same total takes. Converting what is left back to epochs and asking
    for "at least one step" is how a run went one step past the total (the last phase of math
    seed 1: nothing left, one step taken): the caller must end a phase whose budget is 0 at once.
    """
    total = max(0, round(total_epochs * steps_per_epoch))
    left = max(0, total - max(0, int(used_steps)))
    if cap_epochs > 0:
        left = min(left, max(1, round(cap_epochs * steps_per_epoch)))
    return left


class AdaptiveWeightStop:
    """End a weight phase once the sliding-window mean training reward stops setting new bests.

    WHALE: the weight phase ends when the sliding-window mean training reward has set no new
    phase-best for P_w steps (window = minimum length = patience = 0.2 epoch). Exactly: the
    window mean is tracked from the phase's first step (over the steps so far until the window is
    full); a new phase-best must beat the old one strictly; the phase ends at the first step
    t >= `min_steps` at which none of the last `patience` steps (t - patience + 1 .. t) set a new
    best. Window, minimum length and patience are separate keys. Consequences at equal values w:
    a reward flat from the first step ends the phase at step w + 1 (the best is set at step 1);
    a reward that rises until step p and is flat after keeps raising the window mean until the
    window holds the plateau alone (step p + w - 1), so the phase ends at step p + 2w - 1.
    """

    def __init__(self, steps_per_epoch: float, cfg: ScheduleConfig) -> None:
        self.window = max(1, math.ceil(cfg.window_epochs * steps_per_epoch))
        self.patience = max(1, math.ceil(cfg.patience_epochs * steps_per_epoch))
        self.min_steps = max(1, math.ceil(cfg.min_weight_epochs * steps_per_epoch))
        self._rewards: deque[float] = deque(maxlen=self.window)
        self.best = -math.inf
        self.steps = 0
        self.since_best = 0

    def update(self, train_reward: float) -> bool:
        """Record one step's training reward; True when the phase should end now."""
        self.steps += 1
        self._rewards.append(train_reward)
        mean = sum(self._rewards) / len(self._rewards)
        if mean > self.best:
            self.best = mean
            self.since_best = 0
        else:
            self.since_best += 1
        return self.steps >= self.min_steps and self.since_best >= self.patience

    def state_dict(self) -> dict:
        return {
            "rewards": list(self._rewards),
            "best": self.best,
            "steps": self.steps,
            "since_best": self.since_best,
        }

    def load_state_dict(self, d: dict) -> None:
        self._rewards = deque(d["rewards"], maxlen=self.window)
        self.best, self.steps, self.since_best = d["best"], d["steps"], d["since_best"]


class AdaptiveHarnessStop:
    """End a harness phase after `patience` iterations without a new best harness-split score,
    never before `min_iterations`, always at `max_iterations`."""

    def __init__(self, cfg: ScheduleConfig) -> None:
        self.patience = cfg.harness_patience
        self.min_iterations = cfg.min_harness_iterations
        self.max_iterations = cfg.max_harness_iterations
        self.best = -math.inf
        self.iterations = 0
        self.since_best = 0

    def update(self, best_score_so_far: float) -> bool:
        """Record the phase-best score after one iteration; True when the phase should end."""
        self.iterations += 1
        if best_score_so_far > self.best:
            self.best = best_score_so_far
            self.since_best = 0
        else:
            self.since_best += 1
        if self.iterations >= self.max_iterations:
            return True
        return self.iterations >= self.min_iterations and self.since_best >= self.patience

    def state_dict(self) -> dict:
        return {"best": self.best, "iterations": self.iterations, "since_best": self.since_best}

    def load_state_dict(self, d: dict) -> None:
        self.best, self.iterations, self.since_best = d["best"], d["iterations"], d["since_best"]
