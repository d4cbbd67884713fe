"""Paired acceptance: how a harness phase tells a real gain from the noise of its split.

Before a phase's candidates are compared, the incoming harness is scored a second time with other
sampling seeds and paired with its first scoring: that difference is noise alone, so its spread
says the smallest difference the harness split and `rollouts_per_task` can detect (the noise
floor, written to the archive and shown to the reviewer). At the end the best candidate is kept
only when its paired interval against the incoming harness clears `min_gain`
(`PhaseArchive.best(acceptance="paired")`).

The two scorings of the incoming harness also split the reward variance into its within-task
part (sampling: the same task gives different rewards on different rollouts) and its between-task
part, which is what the advice on the user's two knobs rests on: more rollouts per task shrink only
the within-task part of a paired difference's spread, more tasks shrink both. `knob_advice` names
the `rollouts_per_task` and the harness-split size that would make a given difference detectable
and which of the two applies.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from whale_lab.backends.base import SamplingParams
from whale_lab.context import EpisodeSink, Evaluator
from whale_lab.domains.base import Task
from whale_lab.events import Event, HarnessAccepted
from whale_lab.paired import (
    DEFAULT_LEVEL,
    METHOD,
    MIN_TASKS,
    needed_effect,
    needed_tasks,
    paired_difference,
    scores_by_task,
)
from whale_lab.search.archive import PhaseArchive
from whale_lab.store import RunStore, read_jsonl

REPEAT_SALT = 7919  # the second scoring's sampling seeds differ from the first's


def _mix(seed: int | None, salt: int) -> int:
    return ((seed or 0) * 1_000_003 + salt) % (2**31 - 1)


# ---------------------------------------------------------------- variance split and advice

_Z_POWER = 0.8416  # 80% power
_Z_LEVEL = {0.9: 1.6449, 0.95: 1.96, 0.99: 2.5758}


@dataclass(frozen=True)
class VarianceParts:
    """The reward variance of one harness on the harness split, from its two scorings.

    `within`: per-rollout variance of a task's rewards around the task's own success rate
    (sampling), pooled over tasks; `between`: the variance of the tasks' success rates
    (one-way ANOVA estimate, never below 0). `k`: rollouts per task in one scoring."""

    n_tasks: int
    k: int
    within: float
    between: float

    @property
    def within_share(self) -> float:
        total = self.within + self.between
        return self.within / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "within_share": self.within_share}


def variance_parts(
    first: Mapping[str, Sequence[float | None]], repeat: Mapping[str, Sequence[float | None]]
) -> VarianceParts | None:
    """Within- and between-task variance from two scorings of the same harness (per-task rewards;
    None marks an invalid episode); None when fewer than 2 tasks have 2 valid rollouts."""
    pooled: list[list[float]] = []
    counts: list[int] = []
    for task in sorted(set(first) & set(repeat)):
        a = [float(v) for v in first[task] if v is not None and math.isfinite(float(v))]
        b = [float(v) for v in repeat[task] if v is not None and math.isfinite(float(v))]
        if a and b and len(a) + len(b) >= 2:
            pooled.append(a + b)
            counts.append(min(len(a), len(b)))
    if len(pooled) < 2:
        return None
    within = sum(statistics.variance(r) for r in pooled) / len(pooled)
    means = [sum(r) / len(r) for r in pooled]
    per_task = sum(len(r) for r in pooled) / len(pooled)  # rollouts behind each task mean
    between = max(0.0, statistics.variance(means) - within / per_task)
    return VarianceParts(len(pooled), max(1, round(sum(counts) / len(counts))), within, between)


Knob = Literal["none", "rollouts_per_task", "tasks"]


@dataclass(frozen=True)
class KnobAdvice:
    """What it takes to detect `target` (a paired difference in success rate) at 80% power.

    The model: a paired per-task difference has variance `between + 2 * within / k` (`between`:
    how much the difference itself varies from task to task; sampling adds `within / k` per arm),
    and its mean over n tasks that divided by n. More rollouts per task shrink only the sampling
    term; more tasks shrink both."""

    target: float
    n_tasks: int
    k: int
    within: float
    between: float
    knob: Knob
    tasks_needed: int | None  # harness-split size at k as now
    k_needed: int | None  # rollouts_per_task at the split as now; None: no k is enough
    text: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def knob_advice(
    target: float,
    *,
    n_tasks: int,
    k: int,
    within: float,
    between: float,
    level: float = DEFAULT_LEVEL,
) -> KnobAdvice | None:
    """Which knob (rollouts_per_task or the harness split) makes `target` detectable, with the
    values needed; None when there is nothing to advise (no target, no spread at all)."""
    target, k, n = abs(target), max(1, k), max(1, n_tasks)
    within, between = max(0.0, within), max(0.0, between)
    sampling = 2.0 * within / k
    if target <= 1e-12 or sampling + between <= 0.0:
        return None
    z = _Z_LEVEL.get(round(level, 2), 1.96) + _Z_POWER
    tasks = max(MIN_TASKS, needed_tasks(math.sqrt(sampling + between), target, level) or MIN_TASKS)
    room = n * target**2 / z**2 - between  # what sampling may add at n tasks
    # no k is enough when between-task variance alone fills the room, when sampling adds no
    # spread, or on fewer tasks than any verdict needs
    k_needed = (
        max(k + 1, math.ceil(2.0 * within / room))
        if room > 0 and within > 0 and n >= MIN_TASKS
        else None
    )
    pts = f"{100 * target:.1f} points"
    split = (
        f"within-task (sampling) variance {within:.3f} per rollout, /k = {sampling / 2:.3f} per "
        f"arm; between-task variance of the difference {between:.3f}"
    )
    if tasks <= n and n >= MIN_TASKS:
        knob: Knob = "none"
        text = f"a difference of {pts} is detectable at {n} tasks x {k} rollouts ({split})"
    elif sampling > between and k_needed is not None:
        knob = "rollouts_per_task"
        text = (
            f"to detect {pts}: rollouts_per_task = {k_needed} on the {n} tasks "
            f"({n * k_needed:,} rollouts per arm), since within-task variance dominates; or a "
            f"harness split of {tasks} tasks at k = {k} ({tasks * k:,} rollouts per arm) ({split})"
        )
    else:
        knob = "tasks"
        why = (
            "more rollouts per task cannot reach it, between-task variance alone is too large "
            f"for {n} tasks"
            if k_needed is None
            else f"between-task variance dominates (rollouts_per_task = {k_needed} would also "
            f"do, at {n * k_needed:,} rollouts per arm)"
        )
        text = (
            f"to detect {pts}: a harness split of {tasks} tasks at k = {k} "
            f"({tasks * k:,} rollouts per arm); {why} ({split})"
        )
    return KnobAdvice(target, n, k, within, between, knob, tasks, k_needed, text)


def floor_note(
    floor: float | None, n_tasks: int, k: int, parts: VarianceParts | None = None
) -> str:
    """The noise floor in words; with the variance split of the two scorings, which knob would
    halve it (the repeat is the same harness twice, so its spread is sampling alone)."""
    if floor is None:
        text = (
            f"the incoming harness scored the same twice on {n_tasks} tasks x {k}: "
            "no spread to measure"
        )
        if parts is not None and parts.between > 0:
            text += (
                f"; every task gave the same reward on each rollout (between-task variance "
                f"{parts.between:.3f}, none within), so more rollouts per task add nothing: only "
                "more tasks can detect a candidate's gain"
            )
        return text
    text = (
        f"on {n_tasks} tasks x {k} rollouts a paired difference below {100 * floor:.1f} points "
        "cannot be told from noise (80% power, 95% level)"
    )
    if parts is None:
        return text + "; raise rollouts_per_task or the harness split to detect smaller ones"
    advice = knob_advice(floor / 2, n_tasks=n_tasks, k=k, within=parts.within, between=0.0)
    share = f"{100 * parts.within_share:.0f}%"
    text += (
        f"; {share} of the reward variance is within tasks (sampling {parts.within:.3f}, "
        f"between tasks {parts.between:.3f}, which pairing cancels)"
    )
    if advice is not None and advice.k_needed is not None:
        text += (
            f"; to halve it: rollouts_per_task = {advice.k_needed} or a harness split of "
            f"{advice.tasks_needed} tasks (about the same rollouts). A candidate whose gain differs "
            "from task to task adds between-task variance that only more tasks reduce"
        )
    return text


def noise_floor_record(
    candidate_id: str, first: Iterable[Any], repeat: Iterable[Any], k: int
) -> dict[str, Any]:
    """The archive's noise_floor.json from the incoming harness's two scorings (traces or their
    dicts): the paired repeat difference, the floor, the variance split and the note."""
    a, b = scores_by_task(first), scores_by_task(repeat)
    diff = paired_difference(a, b)
    floor = needed_effect(diff.sd, diff.n_tasks)
    parts = variance_parts(a, b)
    d = diff.to_dict()
    return {
        "candidate_id": candidate_id,
        "n_tasks": diff.n_tasks,
        "rollouts_per_task": k,
        "repeat_difference": diff.diff,
        "repeat_interval": [d["low"], d["high"]],
        "sd_of_task_differences": diff.sd,
        "detectable_difference": floor,
        "variance": parts.to_dict() if parts is not None else None,
        "method": f"the incoming harness scored twice, paired; {METHOD}",
        "note": floor_note(floor, diff.n_tasks, k, parts),
    }


def candidate_advice(archive: PhaseArchive, incoming: str, record: Mapping[str, Any], k: int
                     ) -> KnobAdvice | None:
    """Advice for the best candidate's observed difference (`paired_vs_incoming` record): the
    within-task variance from the incoming harness's two scorings, the rest of the observed
    spread of per-task differences is between-task."""
    repeat_path = archive.folder(incoming) / "traces_repeat.jsonl"
    if not repeat_path.is_file():
        return None
    parts = variance_parts(
        scores_by_task(archive.traces(incoming)), scores_by_task(read_jsonl(repeat_path))
    )
    sd, n = record.get("sd"), int(record.get("n_tasks") or 0)
    if parts is None or sd is None or n < 2:
        return None
    between = max(0.0, float(sd) ** 2 - 2.0 * parts.within / max(1, k))
    return knob_advice(
        float(record.get("diff") or 0.0), n_tasks=n, k=k, within=parts.within, between=between
    )


def measure_noise_floor(
    archive: PhaseArchive,
    evaluator: Evaluator,
    incoming: str,
    tasks: Sequence[Task],
    k: int,
    params: SamplingParams,
    *,
    root: Path,
    emit: Callable[[Event], None],
    should_stop: Callable[[], bool],
) -> tuple[dict[str, Any], int]:
    """Score `incoming` again and pair the two runs; returns the record and the rollouts spent."""
    folder = archive.folder(incoming)
    path = folder / "traces_repeat.jsonl"
    path.unlink(missing_ok=True)  # a partial file from an interrupted measurement
    sink = EpisodeSink.for_file(path, root, emit, phase="harness", harness=f"{incoming}-repeat")
    repeat_params = dataclasses.replace(params, seed=_mix(params.seed, REPEAT_SALT))
    try:
        report = evaluator.score(
            folder / "harness.py", tasks, k, repeat_params, on_episode=sink, should_stop=should_stop
        )
    finally:
        sink.close()
    record = noise_floor_record(incoming, archive.traces(incoming), report.traces, k)
    return record, report.rollouts


def paired_acceptance_note(
    archive: PhaseArchive, min_gain: float, k: int | None = None
) -> str | None:
    """One line on what the paired comparison of the best candidate supported; when it kept
    the incoming harness, which knob would make the candidate's observed difference detectable
    (k: rollouts_per_task; default: read from the incoming harness's noise-floor record)."""
    top = archive.best(min_gain=min_gain)
    if top is None:
        return None
    data = archive.read(top, "paired_vs_incoming")
    if not data:
        return None
    verdict = "accepted" if data.get("accepted") else "kept the incoming harness"
    low, high = data.get("low"), data.get("high")
    interval = (
        f"[{100 * low:+.1f}, {100 * high:+.1f}]"
        if low is not None and high is not None
        else "[unknown]"
    )
    line = (
        f"paired acceptance: {top} vs the incoming harness "
        f"{100 * float(data.get('diff', 0.0)):+.1f} points {interval} on "
        f"{data.get('n_tasks', 0)} tasks (95% {METHOD}); {verdict}"
    )
    incoming = data.get("incoming")
    if data.get("accepted") or not incoming or float(data.get("diff") or 0.0) <= 0:
        return line
    if k is None:
        floor = archive.read(str(incoming), "noise_floor") or {}
        k = int(floor.get("rollouts_per_task") or 1)
    advice = candidate_advice(archive, str(incoming), data, k)
    return f"{line}; {advice.text}" if advice is not None and advice.knob != "none" else line


def last_acceptance_is(run_root: Path, event: HarnessAccepted) -> bool:
    """Whether the run's last HarnessAccepted is `event` (same cycle, candidate and file): how a
    resumed phase tells that an acceptance was written before the kill."""
    last = None
    for ev in RunStore.read_events(run_root):
        if isinstance(ev, HarnessAccepted):
            last = ev
    if last is None or (last.cycle, last.candidate_id) != (event.cycle, event.candidate_id):
        return False
    # the same file, compared from the phase folder down (<phase>/candidates/<id>/harness.py)
    # so that a run folder moved between the two processes still matches
    return Path(last.path).parts[-4:] == Path(event.path).parts[-4:]
