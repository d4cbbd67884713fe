"""Paired acceptance: how a harness phase tells a real gain from the noise of its split.

Before a phase's candidates are compared, the incoming harness is scored a second time with other
sampling seeds and paired with its first scoring: that difference is noise alone, so its spread
says the smallest difference the harness split and `rollouts_per_task` can detect (the noise
floor, written to the archive and shown to the reviewer). At the end the best candidate is kept
only when its paired interval against the incoming harness clears `min_gain`
(`PhaseArchive.best(acceptance="paired")`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from whale_lab.backends.base import SamplingParams
from whale_lab.context import EpisodeSink, Evaluator
from whale_lab.domains.base import Task
from whale_lab.events import Event, HarnessAccepted
from whale_lab.paired import METHOD, needed_effect, paired_difference, scores_by_task
from whale_lab.search.archive import PhaseArchive
from whale_lab.store import RunStore

REPEAT_SALT = 7919  # the second scoring's sampling seeds differ from the first's


def _mix(seed: int | None, salt: int) -> int:
    return ((seed or 0) * 1_000_003 + salt) % (2**31 - 1)


def floor_note(floor: float | None, n_tasks: int, k: int) -> str:
    if floor is None:
        return (
            f"the incoming harness scored the same twice on {n_tasks} tasks x {k}: "
            "no spread to measure"
        )
    return (
        f"on {n_tasks} tasks x {k} rollouts a paired difference below {100 * floor:.1f} points "
        "cannot be told from noise (80% power, 95% level); raise rollouts_per_task or the "
        "harness split to detect smaller ones"
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
    repeat = paired_difference(
        scores_by_task(archive.traces(incoming)), scores_by_task(report.traces)
    )
    floor = needed_effect(repeat.sd, repeat.n_tasks)
    d = repeat.to_dict()
    record = {
        "candidate_id": incoming,
        "n_tasks": repeat.n_tasks,
        "rollouts_per_task": k,
        "repeat_difference": repeat.diff,
        "repeat_interval": [d["low"], d["high"]],
        "sd_of_task_differences": repeat.sd,
        "detectable_difference": floor,
        "method": f"the incoming harness scored twice, paired; {METHOD}",
        "note": floor_note(floor, repeat.n_tasks, k),
    }
    return record, report.rollouts


def paired_acceptance_note(archive: PhaseArchive, min_gain: float) -> str | None:
    """One line on what the paired comparison of the best candidate supported."""
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
    return (
        f"paired acceptance: {top} vs the incoming harness "
        f"{100 * float(data.get('diff', 0.0)):+.1f} points {interval} on "
        f"{data.get('n_tasks', 0)} tasks (95% {METHOD}); {verdict}"
    )


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
