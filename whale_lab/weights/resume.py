"""The weight phase's resume points: its state as plain JSON, and loading it back exactly.

After every step the phase writes a resume point (weights, optimizer, and this state: counters,
sampler position, evaluations, the open phase, the served adapter version, the last sync check),
so a run killed at any moment continues from its last completed step with nothing repeated.
A mixin of `RsftPhase`, which holds the attributes it reads.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.events import Log
from whale_lab.weights.checkpoint import CheckpointError
from whale_lab.weights.sync import SyncResult

STATE_VERSION = 1


@dataclass
class EvalRecord:
    step: int
    epoch: float
    val: float
    test: float | None
    checkpoint: str
    harness: str


class ResumablePhase:
    """Resume points of the weight phase (see the module docstring)."""

    # provided by RsftPhase
    step: int
    cycle: int
    rollouts: int
    eval_rollouts: int
    updates: int
    sampler: Any
    next_eval_at: float
    best: dict[str, Any] | None
    evals: list[EvalRecord]
    _phase: dict[str, Any] | None
    tm: Any
    optimizer: Any
    ckpt: Any
    init_adapter: str
    _resume_dir: str | None
    _served: str | None
    served_version: str
    last_sync: SyncResult | None
    emit: Any

    def _eval_interval(self) -> float:  # pragma: no cover - provided by RsftPhase
        raise NotImplementedError

    def _version_now(self) -> str:  # pragma: no cover - provided by RsftPhase
        raise NotImplementedError

    @property
    def epoch(self) -> float:  # pragma: no cover - provided by RsftPhase
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON: counters, sampler position, evaluations, the open phase, and the folder
        holding the matching weights and optimizer state (`resume_dir`)."""
        return {
            "version": STATE_VERSION,
            "step": self.step,
            "cycle": self.cycle,
            "rollouts": self.rollouts,
            "eval_rollouts": self.eval_rollouts,
            "updates": self.updates,
            "sampler": self.sampler.state_dict(),
            "next_eval_at": self.next_eval_at,
            "best": self.best,
            "evals": [dataclasses.asdict(e) for e in self.evals],
            "phase": self._phase,
            "lora": self.tm.lora,
            "init_adapter": self.init_adapter,
            "resume_dir": self._resume_dir,
            "served_version": self.served_version,
            "sync": None if self.last_sync is None else self.last_sync.to_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore counters, sampler position and (from `resume_dir`) weights and optimizer."""
        if int(state.get("version", -1)) != STATE_VERSION:
            raise CheckpointError(
                f"weight-phase state version {state.get('version')!r} is not "
                f"{STATE_VERSION}: made by another whale-lab version"
            )
        if bool(state.get("lora")) != self.tm.lora:
            raise CheckpointError(
                "the saved run trained "
                + ("LoRA" if state.get("lora") else "all weights")
                + "; this config does the other (rsft.full_finetune / model.lora)"
            )
        resume_dir = state.get("resume_dir")
        if resume_dir:
            saved = self.ckpt.load_resume(resume_dir, self.tm, self.optimizer)
            if int(saved.get("step", -1)) != int(state["step"]):
                raise CheckpointError(
                    f"resume point {resume_dir} holds step {saved.get('step')}, "
                    f"the state says step {state['step']}"
                )
        elif int(state.get("step", 0)) > 0:
            raise CheckpointError(f"state at step {state['step']} names no weights to resume from")
        self.sampler.load_state_dict(state["sampler"])
        self.step = int(state["step"])
        self.cycle = int(state.get("cycle", self.cycle))
        self.rollouts = int(state.get("rollouts", 0))
        self.eval_rollouts = int(state.get("eval_rollouts", 0))
        self.updates = int(state.get("updates", 0))
        self.next_eval_at = float(state.get("next_eval_at", self._eval_interval()))
        self.best = state.get("best")
        self.evals = [EvalRecord(**e) for e in state.get("evals", [])]
        self._phase = state.get("phase")
        self.init_adapter = str(state.get("init_adapter", ""))
        self._resume_dir = resume_dir
        self._served = None
        self.served_version = self._version_now()
        saved_sync = state.get("sync")
        self.last_sync = SyncResult.from_dict(saved_sync) if isinstance(saved_sync, dict) else None
        self.tm.eval()

    def resume(self) -> bool:
        """Load the newest complete resume point of this run; False when there is none."""
        latest = self.ckpt.latest()
        if latest is None:
            return False
        from whale_lab.store import read_json

        state = read_json(Path(latest["path"]) / "state.json")
        if not isinstance(state, dict):
            raise CheckpointError(f"resume point {latest['path']} has no readable state.json")
        state = {**state, "resume_dir": latest["path"]}
        self.load_state_dict(state)
        self.emit(
            Log(
                level="info",
                message=f"weights resumed at step {self.step} "
                f"(epoch {self.epoch:.3f}) from {latest['path']}",
            )
        )
        return True

    def save_resume_point(self) -> None:
        """A new resume point with the weights as they are now (after adopting others)."""
        self._persist(new_weights=True)

    def _persist(self, new_weights: bool = False) -> None:
        """Write the resume point: a new folder when weights changed, else just its state."""
        state = self.state_dict()
        state.pop("resume_dir", None)
        latest = self.ckpt.latest()
        if not new_weights and latest is not None and latest["step"] == self.step:
            self.ckpt.update_state(latest["path"], state)
            self._resume_dir = latest["path"]
            return
        self._resume_dir = str(self.ckpt.save_resume(self.step, self.tm, self.optimizer, state))
