"""Scoring a harness under the current weights: used by `whale-lab eval`, RSFT evaluation and search."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab import metrics
from whale_lab.backends.base import Backend, BackendError, SamplingParams
from whale_lab.config import Config, SamplingConfig, SandboxConfig
from whale_lab.domains.base import Domain, Task
from whale_lab.trace import EpisodeTrace

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class EvalReport:
    mean_at_k: float
    pass_at_k: float
    success_rate: float
    mean_turns: float
    tokens: int
    rollouts: int
    k: int
    n_tasks: int
    diagnostics: dict[str, float] = field(default_factory=dict)
    traces: list[EpisodeTrace] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "mean_at_k": self.mean_at_k, "pass_at_k": self.pass_at_k,
            "success_rate": self.success_rate, "mean_turns": self.mean_turns,
            "tokens": self.tokens, "rollouts": self.rollouts, "k": self.k,
            "n_tasks": self.n_tasks, "seconds": round(self.seconds, 3),
            "diagnostics": self.diagnostics,
        }


def sampling_params(cfg: Config, seed: int | None = None) -> SamplingParams:
    s = cfg.sampling
    return SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                          max_new_tokens=s.max_new_tokens, seed=seed)


def default_harness_path(cfg: Config) -> Path:
    if cfg.domain.harness:
        return Path(cfg.domain.harness)
    return REPO_ROOT / "harnesses" / cfg.domain.name / "h0.py"


def score_harness(
    domain: Domain,
    harness_path: str | Path,
    tasks: Sequence[Task],
    k: int,
    backend: Backend,
    params: SamplingParams,
    *,
    sandbox: SandboxConfig | None = None,
    max_context_tokens: int = 2048,
    batch_episodes: int = 256,
    on_episode: Callable[[EpisodeTrace], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    host: Any = None,
    max_invalid_share: float = SamplingConfig.max_invalid_share,
) -> EvalReport:
    """k rollouts per task under one harness; the harness host is started here unless given.

    Episodes run in waves of `batch_episodes` (task x sample pairs) so that memory stays bounded;
    within a wave every turn is one batched generation. Episodes that ended in a backend error are
    not scored; when more than `max_invalid_share` of a wave did, scoring stops with a BackendError
    (a score over refused requests would read as a bad harness).
    """
    from whale_lab.harness import HarnessHost
    from whale_lab.rollout import run_episodes

    t0 = time.perf_counter()
    jobs = [(task, s) for task in tasks for s in range(k)]
    own_host = host is None
    if own_host:
        host = HarnessHost(harness_path, domain.name, sandbox or SandboxConfig())
    traces: list[EpisodeTrace] = []
    try:
        for start in range(0, len(jobs), batch_episodes):
            if should_stop is not None and should_stop():
                break
            wave = jobs[start:start + batch_episodes]
            done = run_episodes(wave, domain, host, backend, params,
                                max_context_tokens=max_context_tokens,
                                on_episode=on_episode, should_stop=should_stop)
            traces.extend(done)
            check_invalid_share(done, backend, max_invalid_share)
    finally:
        if own_host:
            host.close()
    return report_of(traces, k, time.perf_counter() - t0)


def report_of(traces: list[EpisodeTrace], k: int, seconds: float) -> EvalReport:
    """The report of scored episodes: one place computes it, for one harness or for each arm."""
    diag = metrics.diagnostics(traces)
    return EvalReport(
        mean_at_k=metrics.mean_at_k(traces),
        pass_at_k=metrics.pass_at_k(traces, k),
        success_rate=metrics.success_rate(traces),
        mean_turns=diag.get("mean_turns", 0.0),
        tokens=sum(t.prompt_tokens + t.completion_tokens for t in traces),
        rollouts=len(traces),
        k=k,
        n_tasks=len({t.task_id for t in traces}),
        diagnostics=diag,
        traces=traces,
        seconds=seconds,
    )


def check_invalid_share(wave: Sequence[EpisodeTrace], backend: Backend, limit: float) -> None:
    """One-line BackendError naming the server and what it answered, when too much of a wave is
    invalid."""
    invalid = [t for t in wave if metrics.is_invalid(t)]
    if not wave or len(invalid) / len(wave) <= limit:
        return
    errors = Counter(t.error or "generation failed" for t in invalid)
    error, _ = errors.most_common(1)[0]
    statuses = Counter(m.group(1) for t in invalid for m in [re.search(r"HTTP (\d{3})", t.error)] if m)
    label = getattr(backend, "server_label", "") or getattr(backend, "base_url", "")
    server = label or f"the {getattr(backend, 'name', 'model')} backend"
    detail = " ".join(error.split()).removeprefix("the server refused the request: ")
    if statuses:
        status = statuses.most_common(1)[0][0]
        server += f" answered HTTP {status}"
        detail = detail.removeprefix(f"HTTP {status}: ")
    detail = detail if len(detail) <= 200 else detail[:197] + "..."
    raise BackendError(
        f"scoring stopped: {len(invalid)} of {len(wave)} episodes of a wave ended with a backend "
        f"error ({len(invalid) / len(wave):.0%}, more than sampling.max_invalid_share "
        f"{limit:.0%}); {server}: {detail}"
    )
