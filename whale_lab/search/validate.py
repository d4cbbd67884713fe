"""Validation before a human sees a candidate: prompt-only rule, contract + sandbox, smoke run.

The cheap checks run first (prompt-only AST comparison, the harness contract with the sandbox's
import allow-list); only a candidate that passes them gets a smoke run on a few `harness` tasks.
A smoke run where every episode ends in a harness error makes the candidate invalid.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.backends.base import SamplingParams
from whale_lab.config import SandboxConfig
from whale_lab.context import Evaluator
from whale_lab.domains.base import Domain, Task
from whale_lab.search.prompt_only import prompt_only_violation


@dataclass(frozen=True)
class ValidationOutcome:
    ok: bool
    reason: str = ""
    stage: str = ""  # where it failed: "prompt_only" | "contract" | "smoke" | "stopped"
    smoke: dict[str, Any] = field(default_factory=dict)
    smoke_traces: tuple[dict[str, Any], ...] = ()

    @property
    def smoke_success(self) -> float | None:
        v = self.smoke.get("success_rate")
        return float(v) if isinstance(v, (int, float)) else None

    @property
    def rollouts(self) -> int:
        return int(self.smoke.get("rollouts", 0) or 0)

    def record(self) -> dict[str, Any]:
        return {"ok": self.ok, "reason": self.reason, "stage": self.stage}


def static_validation(
    path: str | Path,
    domain: Domain | str,
    sandbox: SandboxConfig,
    *,
    parent_code: str | None = None,
    prompt_only: bool = False,
    open_host: Callable[[], Any] | None = None,
) -> ValidationOutcome:
    """The prompt-only rule and the harness contract (AST check, import allow-list, load, calls);
    `open_host` gives the host to load it in (see `validate_harness`)."""
    from whale_lab.harness import validate_harness

    code = Path(path).read_text(encoding="utf-8")
    if prompt_only and parent_code is not None:
        problem = prompt_only_violation(parent_code, code)
        if problem:
            return ValidationOutcome(False, problem, "prompt_only")
    result = validate_harness(path, domain, sandbox, open_host=open_host)
    if not result.ok:
        return ValidationOutcome(False, result.reason, "contract")
    return ValidationOutcome(True)


def summarise_traces(traces: Sequence[Any]) -> dict[str, Any]:
    """Success, turns, tokens and stop-reason counts of a list of EpisodeTrace (or dicts)."""
    dicts = [t if isinstance(t, dict) else t.to_dict() for t in traces]
    n = len(dicts)
    stops = Counter(str(d.get("stop_reason", "")) for d in dicts)
    tokens = sum(
        sum(
            int(x.get("prompt_tokens", 0)) + int(x.get("completion_tokens", 0))
            for x in d.get("turns") or []
        )
        for d in dicts
    )
    errors = [str(d.get("error")) for d in dicts if d.get("stop_reason") == "harness_error"]
    return {
        "rollouts": n,
        "success_rate": (sum(float(d.get("reward") or 0) > 0.5 for d in dicts) / n) if n else 0.0,
        "mean_turns": (sum(len(d.get("turns") or []) for d in dicts) / n) if n else 0.0,
        "tokens": tokens,
        "failures": {
            k: v for k, v in sorted(stops.items()) if k and k not in ("answered", "solved")
        },
        "stop_reasons": dict(sorted(stops.items())),
        "harness_errors": errors[:3],
    }


def validate_candidate(
    path: str | Path,
    evaluator: Evaluator,
    *,
    smoke_tasks: Sequence[Task],
    params: SamplingParams,
    parent_code: str | None = None,
    prompt_only: bool = False,
    should_stop: Callable[[], bool] | None = None,
    open_host: Callable[[], Any] | None = None,
) -> ValidationOutcome:
    """Static checks, then a smoke run (1 rollout on each smoke task); with `open_host`, both
    in the one host it gives (a candidate's, kept for its scoring)."""
    from whale_lab.harness import HarnessLoadError

    static = static_validation(
        path,
        evaluator.domain,
        evaluator.sandbox,
        parent_code=parent_code,
        prompt_only=prompt_only,
        open_host=open_host,
    )
    if not static.ok or not smoke_tasks:
        return static
    try:
        host = open_host() if open_host is not None else None
        report = evaluator.score(
            path, list(smoke_tasks), 1, params, should_stop=should_stop, host=host
        )
    except HarnessLoadError as exc:
        return ValidationOutcome(False, f"smoke run: {exc}", "smoke")
    if should_stop is not None and should_stop():
        return ValidationOutcome(False, "stopped during the smoke run", "stopped")
    traces = [t.to_dict() for t in report.traces]
    smoke = summarise_traces(traces)
    n = smoke["rollouts"]
    crashed = smoke["stop_reasons"].get("harness_error", 0)
    if n and crashed == n:
        first = smoke["harness_errors"][0] if smoke["harness_errors"] else "no detail"
        return ValidationOutcome(
            False,
            f"smoke run: all {n} episodes ended in a harness error ({first})",
            "smoke",
            smoke,
            tuple(traces),
        )
    return ValidationOutcome(True, "", "", smoke, tuple(traces))
