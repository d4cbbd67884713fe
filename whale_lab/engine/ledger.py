"""One ledger of what a run spent: rollouts by purpose, proposer tokens, cost and time.

The paper counted weight and harness rollouts and left the proposer out. whale-lab keeps everything
in one place so that comparisons are honest: training rollouts (weight, harness), measurement
rollouts (evaluations on val/test, probes) and the proposer's tokens, cost and seconds.

The engine rebuilds the ledger from the things that are persisted anyway (the weight phase's resume
point, each harness phase archive, its own state), so a run killed at any moment resumes with the
same numbers. It is written to `<run>/ledger.json` and kept in `state.json`. Calls to the search
domain's LLM judge are counted in the process (`domains/judge.py`) and folded into
`<run>/judge_usage.json` each time the ledger is written, so they survive a resume too.

It also counts the weight steps by the outcome of their weight-sync check (verified, unverified,
skipped: no new weights to publish) and keeps the last one, so a run whose backend could never
show it served the trained weights says so in its ledger, not only in its events.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from whale_lab.store import atomic_write_json, read_json

LEDGER_FILE = "ledger.json"
JUDGE_FILE = "judge_usage.json"
JUDGE_KEYS = ("calls", "prompt_tokens", "completion_tokens", "fallbacks", "seconds")


@dataclass
class PhaseLedger:
    """What one phase of the schedule used (weight rollouts, harness rollouts, proposer)."""

    index: int
    kind: str  # "weight" | "harness"
    cycle: int
    status: str = "running"  # "running" | "ended"
    reason: str = ""
    weight_rollouts: int = 0
    harness_rollouts: int = 0
    proposer_prompt_tokens: int = 0
    proposer_completion_tokens: int = 0
    proposer_cost: float = 0.0


@dataclass
class ProbeLedger:
    """What one bottleneck probe used, and which of its results the run kept."""

    index: int
    rollouts: int = 0
    weight_rollouts: int = 0  # RSFT steps of the weight probe
    harness_rollouts: int = 0  # scoring and smoke runs of the harness probe
    eval_rollouts: int = 0  # val scoring before and after each side
    proposer_prompt_tokens: int = 0
    proposer_completion_tokens: int = 0
    proposer_cost: float = 0.0
    kept: tuple[str, ...] = ()


@dataclass
class Ledger:
    """Totals for the run; `phases` and `probes` break them down."""

    weight_rollouts: int = 0
    harness_rollouts: int = 0
    eval_rollouts: int = 0
    probe_rollouts: int = 0
    # rollouts of probes whose result the run kept: already inside weight/harness rollouts
    kept_probe_rollouts: int = 0
    proposer_prompt_tokens: int = 0
    proposer_completion_tokens: int = 0
    proposer_cost: float = 0.0
    proposer_seconds: float = 0.0
    # the search domain's LLM judge (domain.judge): requests answered, tokens, exact-match fallbacks
    judge_calls: int = 0
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    judge_fallbacks: int = 0
    judge_seconds: float = 0.0
    # weight steps by the outcome of the check that the backend serves the weights just trained
    sync_verified: int = 0
    sync_unverified: int = 0
    sync_skipped: int = 0
    sync_last: str = ""  # the last weight step's outcome ("" before any step)
    phases: list[PhaseLedger] = field(default_factory=list)
    probes: list[ProbeLedger] = field(default_factory=list)

    @property
    def proposer_tokens(self) -> int:
        return self.proposer_prompt_tokens + self.proposer_completion_tokens

    @property
    def training_rollouts(self) -> int:
        """The paper's count: rollouts that moved weights or harness (x-axis of the curves)."""
        return self.weight_rollouts + self.harness_rollouts

    @property
    def total_rollouts(self) -> int:
        """Every rollout the run generated, each counted once."""
        return (
            self.weight_rollouts
            + self.harness_rollouts
            + self.eval_rollouts
            + self.probe_rollouts
            - self.kept_probe_rollouts
        )

    @property
    def sync_counts(self) -> dict[str, int]:
        """Weight steps by sync outcome, keyed as `weight_step.sync` spells them."""
        return {
            "verified": self.sync_verified,
            "unverified": self.sync_unverified,
            "skipped": self.sync_skipped,
        }

    def set_sync(self, counts: dict[str, Any], last: str) -> None:
        """Take the weight phase's counts by sync outcome (`verified`, `unverified`, `skipped`)."""
        self.sync_verified = int(counts.get("verified", 0) or 0)
        self.sync_unverified = int(counts.get("unverified", 0) or 0)
        self.sync_skipped = int(counts.get("skipped", 0) or 0)
        self.sync_last = str(last or "")

    def add_proposer(self, usage: dict[str, Any]) -> None:
        self.proposer_prompt_tokens += int(usage.get("prompt_tokens", 0) or 0)
        self.proposer_completion_tokens += int(usage.get("completion_tokens", 0) or 0)
        self.proposer_cost += float(usage.get("cost", 0.0) or 0.0)
        self.proposer_seconds += float(usage.get("seconds", 0.0) or 0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["proposer_tokens"] = self.proposer_tokens
        d["training_rollouts"] = self.training_rollouts
        d["total_rollouts"] = self.total_rollouts
        if not any(d[f"judge_{k}"] for k in JUDGE_KEYS):  # a run without a judge: no judge keys
            for k in JUDGE_KEYS:
                del d[f"judge_{k}"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Ledger:
        """Read back a saved ledger; unknown keys (from another version) are ignored."""
        if not isinstance(d, dict):
            return cls()
        names = {f.name for f in fields(cls)} - {"phases", "probes"}
        out = cls(**{k: v for k, v in d.items() if k in names})
        phase_names = {f.name for f in fields(PhaseLedger)}
        probe_names = {f.name for f in fields(ProbeLedger)}
        out.phases = [
            PhaseLedger(**{k: v for k, v in p.items() if k in phase_names})
            for p in d.get("phases", [])
            if isinstance(p, dict)
        ]
        out.probes = [
            ProbeLedger(
                **{k: (tuple(v) if k == "kept" else v) for k, v in p.items() if k in probe_names}
            )
            for p in d.get("probes", [])
            if isinstance(p, dict)
        ]
        return out

    def fold_judge(self, run_root: str | Path) -> None:
        """Add the judge usage of this process since the last fold to the run's judge file, and
        take the run's totals from it."""
        from whale_lab.domains.judge import METER

        path = Path(run_root) / JUDGE_FILE
        saved = read_json(path)
        totals = {k: (saved.get(k, 0) if isinstance(saved, dict) else 0) for k in JUDGE_KEYS}
        new = METER.take().to_dict()
        if any(new[k] for k in JUDGE_KEYS):
            totals = {k: totals[k] + new[k] for k in JUDGE_KEYS}
            atomic_write_json(path, totals)
        for k in JUDGE_KEYS:
            setattr(self, f"judge_{k}", type(getattr(self, f"judge_{k}"))(totals[k]))

    def write(self, run_root: str | Path) -> Path:
        self.fold_judge(run_root)
        path = Path(run_root) / LEDGER_FILE
        atomic_write_json(path, self.to_dict())
        return path

    @classmethod
    def read(cls, run_root: str | Path) -> Ledger:
        return cls.from_dict(read_json(Path(run_root) / LEDGER_FILE))

    def summary_lines(self) -> list[str]:
        """A few plain lines for the headless display and reports."""
        lines = [
            f"rollouts: weight {self.weight_rollouts:,}  harness {self.harness_rollouts:,}  "
            f"eval {self.eval_rollouts:,}  probe {self.probe_rollouts:,}  "
            f"(total {self.total_rollouts:,})",
            f"proposer: {self.proposer_prompt_tokens:,} prompt + "
            f"{self.proposer_completion_tokens:,} completion tokens, "
            f"${self.proposer_cost:.4f}, {self.proposer_seconds:.1f}s",
        ]
        if any(self.sync_counts.values()):
            lines.append(
                f"weight sync: {self.sync_verified:,} verified, {self.sync_unverified:,} "
                f"unverified, {self.sync_skipped:,} skipped (no new weights); last: "
                f"{self.sync_last or '-'}"
            )
        if self.judge_calls or self.judge_fallbacks:
            lines.append(
                f"judge: {self.judge_calls:,} calls, {self.judge_prompt_tokens:,} prompt + "
                f"{self.judge_completion_tokens:,} completion tokens, {self.judge_fallbacks:,} "
                f"fell back to exact match, {self.judge_seconds:.1f}s"
            )
        return lines
