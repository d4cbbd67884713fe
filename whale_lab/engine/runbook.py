"""The run's book: its folder, its typed state, the live phases, and the counts derived from them.

Everything that reports on a run (the ledger, evaluation identities, rollout counts) is derived
here from what is persisted, plus the weight phase and harness phase live in this process, so the
numbers survive any kill unchanged.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from whale_lab.engine.ledger import Ledger, PhaseLedger
from whale_lab.engine.state import PhaseRecord, RunState
from whale_lab.store import RunStore, read_json


def file_sha(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


class RunBook:
    """One run folder's state and the live phase objects that add to it."""

    def __init__(self, store: RunStore, state: RunState) -> None:
        self.store = store
        self.root = store.root
        self.state = state
        self.rsft: Any = None  # the run's weight phase (lives as long as the run)
        self.hp: Any = None  # the harness phase running now
        self.hp_index = -1

    # ------------------------------------------------------------------ paths
    def rel(self, path: str | Path) -> str:
        p = Path(path)
        try:
            return p.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(p)

    def abs(self, path: str | Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.root / p

    @property
    def harness_path(self) -> Path:
        """The accepted harness now (the one the next weight phase trains under)."""
        return self.abs(self.state.harness)

    # ------------------------------------------------------------------ persistence
    def save(self) -> None:
        """state.json and ledger.json, both atomic."""
        r = self.rsft
        if r is not None:
            self.state.weights = {
                "rollouts": int(r.rollouts),
                "eval_rollouts": int(r.eval_rollouts),
                "step": int(r.step),
                "updates": int(r.updates),
                "sampler": r.sampler.state_dict(),
            }
        ledger = self.ledger()
        self.state.ledger = ledger.to_dict()
        self.state.updated = time.time()
        self.store.write_state(self.state.to_dict())
        ledger.write(self.root)

    # ------------------------------------------------------------------ counts
    def weight_rollouts(self) -> int:
        r = self.rsft
        return int(r.rollouts) if r is not None else int(self.state.weights["rollouts"])

    def weight_eval_rollouts(self) -> int:
        r = self.rsft
        return int(r.eval_rollouts) if r is not None else int(self.state.weights["eval_rollouts"])

    def archive_state(self, rec: PhaseRecord) -> dict[str, Any]:
        """A harness phase's archive state: live if it runs now, else from its folder."""
        if self.hp is not None and int(rec.index) == self.hp_index:
            return self.hp.state
        data = read_json(self.abs(rec.dir or "") / "state.json", {})
        return data if isinstance(data, dict) else {}

    def harness_rollouts(self) -> int:
        total = int(self.state.kept_harness_rollouts)
        for rec in self.state.phases:
            if rec.kind == "harness":
                total += int(self.archive_state(rec).get("rollouts", 0))
        return total

    # ------------------------------------------------------------------ identities
    def weights_identity(self) -> str:
        r = self.rsft
        base = f"rsft:{r.step}:{r.updates}" if r is not None and r.updates > 0 else "base"
        return f"{base}:kept{self.state.kept_weights}"

    def identity(self) -> str:
        """What an evaluation point evaluates: these weights with this harness."""
        return f"{self.weights_identity()}|{file_sha(self.harness_path)}"

    # ------------------------------------------------------------------ ledger
    def ledger(self) -> Ledger:
        """Rebuilt from what is persisted, so it survives any kill unchanged."""
        st = self.state
        led = Ledger(
            weight_rollouts=self.weight_rollouts(),
            harness_rollouts=self.harness_rollouts(),
            eval_rollouts=self.weight_eval_rollouts() + int(st.eval_rollouts),
            probe_rollouts=int(st.probe_rollouts),
            kept_probe_rollouts=int(st.kept_probe_rollouts),
        )
        for rec in st.phases:
            entry = PhaseLedger(
                index=int(rec.index),
                kind=rec.kind,
                cycle=int(rec.cycle),
                status="ended" if rec.status == "ended" else "running",
                reason=rec.reason,
            )
            if rec.kind == "weight":
                end = rec.end_weight_rollouts
                end = int(end) if end is not None else self.weight_rollouts()
                entry.weight_rollouts = end - int(rec.start_weight_rollouts)
            else:
                archive = self.archive_state(rec)
                usage = archive.get("usage", {}) or {}
                entry.harness_rollouts = int(archive.get("rollouts", 0))
                entry.proposer_prompt_tokens = int(usage.get("prompt_tokens", 0))
                entry.proposer_completion_tokens = int(usage.get("completion_tokens", 0))
                entry.proposer_cost = float(usage.get("cost", 0.0))
                led.add_proposer(usage)
            led.phases.append(entry)
        led.add_proposer(st.probe_usage)
        led.probes = Ledger.from_dict({"probes": st.probes}).probes
        r = self.rsft
        if r is not None:  # live, or loaded from its resume point
            led.set_sync(r.sync_counts, r.last_step_sync)
        else:  # not loaded in this process yet: the counts the last saved ledger had
            saved = Ledger.from_dict(st.ledger if isinstance(st.ledger, dict) else None)
            led.set_sync(saved.sync_counts, saved.sync_last)
        return led
