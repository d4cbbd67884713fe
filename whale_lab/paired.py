"""Paired comparisons: two arms scored on the same tasks, the difference judged against its noise.

Every verdict whale-lab gives (which harness to accept, which lever a probe names, which schedule
a comparison favours) compares two arms on the same tasks with the same per-task seeds. This module
turns per-task scores of both arms into per-task wins, losses and ties, the mean difference and a
percentile-bootstrap interval over tasks (the method is named in every result), and says how many
tasks a difference of a given size would need. Pure functions of numbers: no engine, no I/O.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

METHOD = "percentile bootstrap over tasks"
DEFAULT_RESAMPLES = 2000
DEFAULT_LEVEL = 0.95
MIN_TASKS = 5  # fewer paired tasks never support a verdict
# a bound this close to zero is zero: means of per-task means carry rounding error (1e-18)
_EPS = 1e-12
_Z = {0.8: 1.2816, 0.9: 1.6449, 0.95: 1.96, 0.99: 2.5758}


@dataclass(frozen=True)
class PairedResult:
    """B minus A on the tasks both arms scored; the interval is for the mean difference."""

    n_tasks: int
    mean_a: float
    mean_b: float
    diff: float
    low: float
    high: float
    wins: int  # tasks where B scored higher
    losses: int
    ties: int
    level: float = DEFAULT_LEVEL
    method: str = METHOD
    sd: float = 0.0  # standard deviation of the per-task differences
    invalid_tasks: int = 0  # tasks left out because an arm had no valid score there

    @property
    def excludes_zero(self) -> bool:
        return self.n_tasks >= MIN_TASKS and (self.low > _EPS or self.high < -_EPS)

    @property
    def interval(self) -> tuple[float, float]:
        return (self.low, self.high)

    def verdict(self, margin: float = 0.0) -> str:
        """ "better" when the whole interval is above `margin`, "worse" when below `-margin`,
        else "inconclusive"."""
        if self.n_tasks < MIN_TASKS:
            return "inconclusive"  # the bootstrap is too optimistic on a handful of tasks
        if self.low > margin + _EPS:
            return "better"
        if self.high < -margin - _EPS:
            return "worse"
        return "inconclusive"

    def needed_tasks(self, effect: float | None = None) -> int | None:
        """Tasks a paired comparison would need to resolve `effect` (default: the observed
        difference) at this level with 80% power, from the observed spread; None if unknowable."""
        return needed_tasks(self.sd, abs(self.diff) if effect is None else abs(effect), self.level)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("low", "high"):  # JSON has no infinity: an unknown bound is null
            if not math.isfinite(out[key]):
                out[key] = None
        out["interval"] = [out["low"], out["high"]]
        out["excludes_zero"] = self.excludes_zero
        out["verdict"] = self.verdict()
        out["needed_tasks"] = self.needed_tasks()
        return out

    def describe(self, unit: str = "", scale: float = 1.0) -> str:
        """One plain line: the difference, its interval, the tally and what it supports."""
        d, lo, hi = self.diff * scale, self.low * scale, self.high * scale
        text = (
            f"{d:+.3g}{unit} [{lo:+.3g}, {hi:+.3g}] ({int(self.level * 100)}% {self.method}; "
            f"{self.wins} wins / {self.losses} losses / {self.ties} ties on {self.n_tasks} tasks)"
        )
        if self.excludes_zero:
            return text
        need = self.needed_tasks()
        size = f"; about {need} tasks would resolve a difference this size" if need else ""
        return f"{text}: no difference detected at this size{size}"


def needed_tasks(sd: float, effect: float, level: float = DEFAULT_LEVEL) -> int | None:
    """n with z_(1-alpha/2) + z_power = effect / (sd / sqrt(n)), power 0.8."""
    if effect <= _EPS or sd <= 0 or not math.isfinite(sd) or not math.isfinite(effect):
        return None  # a zero difference (up to rounding) needs no size, any size fails it
    z = _Z.get(round(level, 2), 1.96) + 0.8416
    return max(2, math.ceil((z * sd / effect) ** 2))


def needed_effect(sd: float, n_tasks: int, level: float = DEFAULT_LEVEL) -> float | None:
    """The smallest paired difference `n_tasks` tasks detect at this level with 80% power."""
    if n_tasks < 2 or sd <= 0 or not math.isfinite(sd):
        return None
    z = _Z.get(round(level, 2), 1.96) + 0.8416
    return z * sd / math.sqrt(n_tasks)


def task_means(scores: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """Per-task mean over the valid samples (None marks an invalid episode)."""
    out: dict[str, float] = {}
    for task, values in scores.items():
        valid = [float(v) for v in values if v is not None and math.isfinite(float(v))]
        if valid:
            out[task] = sum(valid) / len(valid)
    return out


def paired_difference(
    a: Mapping[str, Sequence[float | None]],
    b: Mapping[str, Sequence[float | None]],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> PairedResult:
    """B minus A over the tasks both arms have valid scores for (per-task means of samples)."""
    ma, mb = task_means(a), task_means(b)
    tasks = sorted(set(ma) & set(mb))
    invalid = len((set(a) | set(b)) - set(tasks))
    diffs = [mb[t] - ma[t] for t in tasks]
    n = len(diffs)
    if n == 0:
        return PairedResult(
            0, 0.0, 0.0, 0.0, -math.inf, math.inf, 0, 0, 0, level, invalid_tasks=invalid
        )
    mean = sum(diffs) / n
    low, high = bootstrap_interval(diffs, level=level, resamples=resamples, seed=seed)
    eps = 1e-12
    return PairedResult(
        n_tasks=n,
        mean_a=sum(ma[t] for t in tasks) / n,
        mean_b=sum(mb[t] for t in tasks) / n,
        diff=mean,
        low=low,
        high=high,
        wins=sum(1 for d in diffs if d > eps),
        losses=sum(1 for d in diffs if d < -eps),
        ties=sum(1 for d in diffs if abs(d) <= eps),
        level=level,
        sd=statistics.stdev(diffs) if n > 1 else 0.0,
        invalid_tasks=invalid,
    )


def bootstrap_interval(
    diffs: Sequence[float],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap of the mean over tasks; deterministic for a seed."""
    n = len(diffs)
    if n < 2:
        return (-math.inf, math.inf)  # one task says nothing about the spread
    if all(d == diffs[0] for d in diffs):
        return (float(diffs[0]), float(diffs[0]))
    rng = random.Random(seed)
    means = sorted(sum(rng.choice(diffs) for _ in range(n)) / n for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    lo = means[max(0, int(math.floor(tail * resamples)))]
    hi = means[min(resamples - 1, int(math.ceil((1.0 - tail) * resamples)) - 1)]
    return (lo, hi)


def scores_by_task(traces: Iterable[Any]) -> dict[str, list[float | None]]:
    """Per-task rewards from episode traces (`task_id`, `reward`, `stop_reason`, or their dicts);
    an episode that ended in a backend error is invalid (None), not a zero."""
    out: dict[str, list[float | None]] = {}
    for t in traces:
        get = t.get if isinstance(t, dict) else (lambda k, d=None, _t=t: getattr(_t, k, d))
        task = str(get("task_id", ""))
        invalid = get("stop_reason", "") == "backend_error"
        out.setdefault(task, []).append(None if invalid else float(get("reward", 0.0)))
    return out


@dataclass(frozen=True)
class InteractionEffect:
    """A 2 x 2 paired design: arm B against arm A under condition 0 and under condition 1, on
    the tasks all four cells scored. `interaction` is (B - A under 1) minus (B - A under 0)."""

    n_tasks: int
    cells: dict[str, float]  # "a0", "b0", "a1", "b1": mean over the shared tasks
    gain_0: PairedResult
    gain_1: PairedResult
    interaction: PairedResult

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_tasks": self.n_tasks,
            "cells": dict(self.cells),
            "gain_before": self.gain_0.to_dict(),
            "gain_after": self.gain_1.to_dict(),
            "interaction": self.interaction.to_dict(),
        }


def interaction_effect(
    a0: Mapping[str, Sequence[float | None]],
    b0: Mapping[str, Sequence[float | None]],
    a1: Mapping[str, Sequence[float | None]],
    b1: Mapping[str, Sequence[float | None]],
    *,
    level: float = DEFAULT_LEVEL,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> InteractionEffect:
    """B's gain over A under each condition, and how much it changes between them, each paired
    over the tasks every cell has a valid score for (a task invalid in one cell leaves all four)."""
    means = [task_means(x) for x in (a0, b0, a1, b1)]
    shared = set(means[0]).intersection(*means[1:])
    tasks = sorted(shared)
    m = [{t: [x[t]] for t in tasks} for x in means]
    gain_0 = paired_difference(m[0], m[1], level=level, resamples=resamples, seed=seed)
    gain_1 = paired_difference(m[2], m[3], level=level, resamples=resamples, seed=seed + 1)
    g0 = {t: [means[1][t] - means[0][t]] for t in tasks}
    g1 = {t: [means[3][t] - means[2][t]] for t in tasks}
    inter = paired_difference(g0, g1, level=level, resamples=resamples, seed=seed + 2)
    n = len(tasks)
    cells = {
        name: (sum(x[t] for t in tasks) / n if n else math.nan)
        for name, x in zip(("a0", "b0", "a1", "b1"), means, strict=True)
    }
    invalid = len(set().union(*(set(x) for x in (a0, b0, a1, b1))) - shared)
    inter = PairedResult(**{**asdict(inter), "invalid_tasks": invalid})
    return InteractionEffect(n, cells, gain_0, gain_1, inter)
