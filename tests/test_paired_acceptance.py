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
