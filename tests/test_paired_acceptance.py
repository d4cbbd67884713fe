"""Paired acceptance refuses a noise-level win and takes a real one; the noise floor is measured."""

from __future__ import annotations

from pathlib import Path

from whale_lab.search.archive import INCOMING, PhaseArchive

H0 = 'SYSTEM_PROMPT = "x"\nUSER_PROMPT = "{question}"\n'


def _scored(archive: PhaseArchive, proposer: str, rewards: list[float], it: int) -> str:
    cid = archive.add_candidate(
        H0 + f"# {proposer} {it}\n", parent_id="", hypothesis="h", surface="prompts",
        proposer=proposer, iteration=it,
    )
    traces = [
        {"task_id": f"t{i}", "sample": 0, "reward": r, "stop_reason": "answered", "turns": []}
        for i, r in enumerate(rewards)
    ]
    archive.write_traces(cid, traces)
    n = len(rewards)
    archive.write_json(
        cid, "scores", {"success_rate": sum(rewards) / n, "mean_turns": 1.0, "rollouts": n}
    )
    archive.set_status(cid, "evaluated")
    return cid


def test_a_noise_level_win_keeps_the_incoming_harness(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    base = [1.0 if i % 4 == 0 else 0.0 for i in range(16)]  # 4 of 16
    lucky = list(base)
    lucky[1] = 1.0  # one more task: 5 of 16
    incoming = _scored(archive, INCOMING, base, 1)
    cand = _scored(archive, "rules", lucky, 2)
    assert archive.best() == cand  # the paper's rule takes the one-task win
    assert archive.best(acceptance="paired") == incoming
    record = archive.read(cand, "paired_vs_incoming")
    assert record["accepted"] is False and record["low"] <= 0 < record["high"]
    assert record["wins"] == 1 and record["losses"] == 0 and record["n_tasks"] == 16


def test_a_real_win_is_accepted(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    incoming = _scored(archive, INCOMING, [0.0] * 24 + [1.0] * 6, 1)
    cand = _scored(archive, "rules", [1.0] * 28 + [0.0] * 2, 2)
    assert archive.best(acceptance="paired") == cand
    record = archive.read(cand, "paired_vs_incoming")
    assert record["accepted"] is True and record["low"] > 0
    # min_gain raises the bar: the lower bound must clear it
    assert archive.best(min_gain=0.9, acceptance="paired") == incoming


def test_a_loss_keeps_the_incoming_harness(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    incoming = _scored(archive, INCOMING, [1.0] * 20, 1)
    _scored(archive, "rules", [0.0] * 20, 2)
    assert archive.best(acceptance="paired") == incoming


# ------------------------------------------------ which knob makes a difference detectable

import json  # noqa: E402

import pytest  # noqa: E402

from whale_lab.search.acceptance import (  # noqa: E402
    floor_note,
    knob_advice,
    noise_floor_record,
    paired_acceptance_note,
    variance_parts,
)

Z2 = (1.96 + 0.8416) ** 2  # 95% level, 80% power


def _by_task(rewards: list[float]) -> dict[str, list[float | None]]:
    return {f"t{i}": [r] for i, r in enumerate(rewards)}


def _write_repeat(archive: PhaseArchive, cid: str, rewards: list[float]) -> None:
    lines = [
        json.dumps({"task_id": f"t{i}", "sample": 0, "reward": r, "stop_reason": "answered"})
        for i, r in enumerate(rewards)
    ]
    (archive.folder(cid) / "traces_repeat.jsonl").write_text("\n".join(lines) + "\n")


def test_two_scorings_split_within_from_between_task_variance() -> None:
    # every task a coin (p = 0.5), 8 rollouts per scoring: all the variance is within tasks
    coin = {f"t{i}": [1.0, 0.0] * 4 for i in range(10)}
    parts = variance_parts(coin, coin)
    assert parts is not None and parts.k == 8
    assert parts.within == pytest.approx(16 * 0.25 / 15)  # sample variance of 8 ones, 8 zeros
    assert parts.between == 0.0 and parts.within_share == 1.0
    # every task always right or always wrong: all of it between tasks, none within
    fixed = {f"t{i}": [float(i % 2)] * 2 for i in range(10)}
    parts = variance_parts(fixed, fixed)
    assert parts is not None and parts.within == 0.0
    assert parts.between == pytest.approx(10 * 0.25 / 9) and parts.within_share == 0.0
    # one rollout per scoring still separates them (two rollouts per task in all)
    assert variance_parts(_by_task([1.0, 0.0, 1.0]), _by_task([0.0, 0.0, 1.0])) is not None
    assert variance_parts(_by_task([1.0]), _by_task([0.0])) is None  # one task: no spread


def test_knob_advice_names_rollouts_when_sampling_dominates_and_tasks_otherwise() -> None:
    # sampling dominates (2 * 0.25 / 1 against 0.01): k = 4 on 32 tasks reaches 0.1875
    a = knob_advice(0.1875, n_tasks=32, k=1, within=0.25, between=0.01)
    assert a is not None and a.knob == "rollouts_per_task"
    room = 32 * 0.1875**2 / Z2 - 0.01
    assert a.k_needed == max(2, -(-0.5 // room)) == 4
    assert a.tasks_needed == -(-Z2 * 0.51 // 0.1875**2)
    assert "rollouts_per_task = 4 on the 32 tasks" in a.text
    assert "within-task variance dominates" in a.text
    # between-task variance alone is too large for 16 tasks: no k is enough, only tasks
    b = knob_advice(0.1875, n_tasks=16, k=1, within=0.05, between=0.30)
    assert b is not None and b.knob == "tasks" and b.k_needed is None
    assert b.tasks_needed == -(-Z2 * 0.40 // 0.1875**2)
    assert "more rollouts per task cannot reach it" in b.text
    assert f"a harness split of {b.tasks_needed} tasks at k = 1" in b.text
    # between dominates but k could still do it: tasks named first, k given beside it
    c = knob_advice(0.3, n_tasks=20, k=1, within=0.05, between=0.2)
    assert c is not None and c.knob == "tasks" and c.k_needed is not None
    assert "between-task variance dominates" in c.text
    # no sampling spread at all: rollouts per task add nothing
    d = knob_advice(0.2, n_tasks=16, k=2, within=0.0, between=0.25)
    assert d is not None and d.knob == "tasks" and d.k_needed is None
    # already detectable
    e = knob_advice(0.5, n_tasks=64, k=4, within=0.25, between=0.05)
    assert e is not None and e.knob == "none"
    assert knob_advice(0.0, n_tasks=16, k=1, within=0.25, between=0.0) is None


def test_floor_note_says_which_knob_halves_the_floor() -> None:
    first = [1.0, 0.0] * 8 + [1.0] * 4 + [0.0] * 4
    repeat = [0.0, 1.0] * 8 + [1.0] * 4 + [0.0] * 4
    record = noise_floor_record("c000", _traces(first), _traces(repeat), 1)
    assert record["variance"]["within"] == pytest.approx(16 * 0.5 / 24)
    note = record["note"]
    assert note.startswith("on 24 tasks x 1 rollouts a paired difference below")
    assert "to halve it: rollouts_per_task = " in note and "or a harness split of " in note
    # a repeat identical task by task: no sampling spread, only more tasks can help
    same = noise_floor_record("c000", _traces(first), _traces(first), 1)
    assert same["detectable_difference"] is None
    assert "more rollouts per task add nothing: only more tasks" in same["note"]
    # without the split the old advice stays
    assert "raise rollouts_per_task or the harness split" in floor_note(0.3, 16, 1)


def _traces(rewards: list[float]) -> list[dict]:
    return [
        {"task_id": f"t{i}", "sample": 0, "reward": r, "stop_reason": "answered"}
        for i, r in enumerate(rewards)
    ]


def test_acceptance_note_asks_for_rollouts_when_sampling_noise_hides_the_win(
    tmp_path: Path,
) -> None:
    """Incoming scored twice at k = 1 on 32 tasks: half the tasks flip between its two scorings
    (sampling). The candidate's win (+6 tasks) is no larger than that noise, so only more
    rollouts per task (or many more tasks) would tell: the note names rollouts_per_task."""
    archive = PhaseArchive(tmp_path)
    # tasks 0-7: 1 then 0; 8-15: 0 then 1; 16-23: always 0; 24-31: always 1
    first = [1.0] * 8 + [0.0] * 8 + [0.0] * 8 + [1.0] * 8
    repeat = [0.0] * 8 + [1.0] * 8 + [0.0] * 8 + [1.0] * 8
    cand = list(first)
    for i in list(range(8, 16)) + [16, 17]:  # +1 on 10 tasks the incoming missed
        cand[i] = 1.0
    for i in (0, 1, 24, 25):  # -1 on 4
        cand[i] = 0.0
    incoming = _scored(archive, INCOMING, first, 1)
    _write_repeat(archive, incoming, repeat)
    archive.write_json(incoming, "noise_floor", {"rollouts_per_task": 1})
    c = _scored(archive, "rules", cand, 2)
    assert archive.best(acceptance="paired") == incoming
    record = archive.read(c, "paired_vs_incoming")
    assert record["diff"] == pytest.approx(6 / 32) and not record["accepted"]
    note = paired_acceptance_note(archive, 0.0)
    assert note is not None and "kept the incoming harness" in note
    assert "rollouts_per_task = 4 on the 32 tasks" in note, note
    assert "within-task variance dominates" in note


def test_acceptance_note_asks_for_tasks_when_tasks_differ_not_samples(tmp_path: Path) -> None:
    """Incoming scored twice gives the same reward on every task (no sampling spread); the
    candidate wins 4 tasks and loses 1 of 16: a gain that differs from task to task, which
    no number of rollouts per task can resolve; the note names the tasks needed."""
    archive = PhaseArchive(tmp_path)
    first = [1.0] * 8 + [0.0] * 8
    cand = list(first)
    for i in (8, 9, 10, 11):
        cand[i] = 1.0
    cand[0] = 0.0
    incoming = _scored(archive, INCOMING, first, 1)
    _write_repeat(archive, incoming, first)
    c = _scored(archive, "rules", cand, 2)
    assert archive.best(acceptance="paired") == incoming
    record = archive.read(c, "paired_vs_incoming")
    sd2 = record["sd"] ** 2
    note = paired_acceptance_note(archive, 0.0, k=1)
    assert note is not None
    needed = -(-Z2 * sd2 // (3 / 16) ** 2)
    assert f"a harness split of {int(needed)} tasks at k = 1" in note, note
    assert "more rollouts per task cannot reach it" in note
