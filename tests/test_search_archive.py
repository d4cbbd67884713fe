"""The phase archive: layout, diffs, statuses, traces scrubbed, summary, frontier, acceptance order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale_lab.search.archive import ArchiveError, PhaseArchive
from whale_lab.search.prompt_only import prompt_only_violation
from whale_lab.search.surfaces import changed_surfaces

H0 = '''"""A tiny harness."""
SYSTEM_PROMPT = "Answer briefly."
USER_PROMPT = "Question: {question}"
MAX_TURNS = 2


def parse_action(response):
    return response.strip()
'''


def _scored(
    archive: PhaseArchive,
    cid: str,
    rate: float,
    turns: float,
    tokens: int = 1000,
    rollouts: int = 10,
) -> None:
    archive.write_json(
        cid,
        "scores",
        {
            "success_rate": rate,
            "mean_turns": turns,
            "tokens": tokens,
            "rollouts": rollouts,
            "failures": {"turn_cap": 2},
        },
    )
    archive.set_status(cid, "evaluated")


def test_layout_diff_status_and_summary(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path / "phase")
    c0 = archive.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer="incoming", iteration=1
    )
    code = H0.replace("MAX_TURNS = 2", "MAX_TURNS = 4")
    c1 = archive.add_candidate(
        code,
        parent_id=c0,
        hypothesis="More turns.\nEvidence: c000/t#0",
        surface="termination",
        proposer="rules",
        iteration=2,
        mechanism="turn_budget",
        cited_traces=["c000/t#0"],
    )
    assert (c0, c1) == ("c000", "c001")
    folder = archive.folder(c1)
    for name in ("harness.py", "meta.json", "diff.patch", "hypothesis.md", "status.json"):
        assert (folder / name).is_file(), name
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["parent_id"] == "c000" and meta["surface"] == "termination"
    assert meta["cited_traces"] == ["c000/t#0"]
    diff = archive.diff(c1)
    assert "--- c000/harness.py" in diff and "+++ c001/harness.py" in diff
    assert "-MAX_TURNS = 2" in diff and "+MAX_TURNS = 4" in diff
    assert archive.status(c1) == "proposed"

    archive.write_json(c1, "validation", {"ok": True, "reason": ""})
    archive.write_json(c1, "smoke", {"success_rate": 0.5})
    archive.set_status(c1, "awaiting_review")
    archive.write_json(c1, "decision", {"decision": "reject", "reason": "too many turns"})
    archive.set_status(c1, "rejected", "too many turns")
    _scored(archive, c0, 0.25, 2.0)
    history = json.loads((folder / "status.json").read_text())["history"]
    assert [h["status"] for h in history] == ["proposed", "awaiting_review", "rejected"]

    archive.write_summary()
    rows = json.loads((archive.root / "summary.json").read_text())["candidates"]
    assert [r["id"] for r in rows] == ["c000", "c001"]
    assert rows[1]["status"] == "rejected" and rows[1]["decision_reason"] == "too many turns"
    assert rows[1]["smoke_success"] == 0.5 and rows[0]["tokens_per_rollout"] == 100.0
    md = (archive.root / "summary.md").read_text()
    assert "| c001 | 2 | c000 | termination |" in md and "too many turns" in md
    assert (archive.root / "README.md").exists()
    frontier = json.loads((archive.root / "frontier.json").read_text())
    assert frontier["best"] == "c000" and frontier["pareto"] == ["c000"]


def test_bad_requests_are_clear_errors(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    with pytest.raises(ArchiveError, match="parent 'c009' is not in the archive"):
        archive.add_candidate(
            H0, parent_id="c009", hypothesis="x", surface="parser", proposer="rules", iteration=2
        )
    c0 = archive.add_candidate(
        H0, parent_id="", hypothesis="x", surface="", proposer="i", iteration=1
    )
    with pytest.raises(ArchiveError, match="empty"):
        archive.add_candidate(
            "  ", parent_id=c0, hypothesis="x", surface="", proposer="i", iteration=2
        )
    with pytest.raises(ArchiveError, match="unknown status"):
        archive.set_status(c0, "great")
    with pytest.raises(ArchiveError, match="not a candidate id"):
        archive.folder("../etc")


def test_traces_are_scrubbed_of_reference_answers(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    c0 = archive.add_candidate(
        H0, parent_id="", hypothesis="x", surface="", proposer="i", iteration=1
    )
    trace = {
        "task_id": "t1",
        "sample": 0,
        "reward": 1.0,
        "turns": [],
        "info": {"answer": "Paris", "gold": ["Paris"], "retrieval_recall": True},
    }
    assert archive.write_traces(c0, [trace]) == 1
    (back,) = list(archive.traces(c0))
    # retrieval_recall is computed from the gold answers: engine-side only, never in the archive
    assert back["info"] == {}
    text = (archive.folder(c0) / "traces.jsonl").read_text()
    assert "Paris" not in text and "retrieval_recall" not in text


def test_best_ties_go_to_fewer_turns_and_pin_overrides(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    ids = [
        archive.add_candidate(
            H0 + f"\n# v{i}\n", parent_id="", hypothesis="x", surface="", proposer="i", iteration=1
        )
        for i in range(4)
    ]
    _scored(archive, ids[0], 0.50, 3.0)
    _scored(archive, ids[1], 0.50, 2.0)  # same rate, fewer turns: wins
    _scored(archive, ids[2], 0.25, 1.0)
    archive.write_json(ids[3], "scores", {"success_rate": 0.9, "mean_turns": 1.0})
    archive.set_status(ids[3], "crashed", "hang")  # crashed never counts
    assert archive.best() == ids[1]
    archive.pin(ids[2], reason="shorter prompt")
    assert archive.pinned() == ids[2]
    assert archive.lineage(ids[1]) == [ids[1]]


def test_min_gain_keeps_the_incoming_harness_unless_beaten_by_the_margin(tmp_path: Path) -> None:
    archive = PhaseArchive(tmp_path)
    incoming = archive.add_candidate(
        H0, parent_id="", hypothesis="x", surface="", proposer="incoming", iteration=1
    )
    new = archive.add_candidate(
        H0 + "\n# v1\n", parent_id=incoming, hypothesis="y", surface="", proposer="rules",
        iteration=2,
    )
    _scored(archive, incoming, 0.3125, 2.0)  # 5 of 16 tasks
    _scored(archive, new, 0.375, 2.0)  # 6 of 16: one task better
    assert archive.best() == new  # the spec's rule: the best wins
    assert archive.best(min_gain=0.0625) == new  # exactly the margin is enough
    assert archive.best(min_gain=0.1) == incoming  # a one-task win is not
    _scored(archive, new, 0.25, 1.0)
    assert archive.best(min_gain=0.1) == incoming  # the incoming one is best anyway


def test_changed_surfaces_follow_helpers() -> None:
    code = (
        H0
        + """

def _clean(text):
    return text.strip(" .")


def parse_action(response):
    return _clean(response)
"""
    )
    assert changed_surfaces(H0, code) == ["parser"]
    prompt = H0.replace("Answer briefly.", "Answer in one word.")
    assert changed_surfaces(H0, prompt) == ["prompts"]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.replace("MAX_TURNS = 2", "MAX_TURNS = 3"), "`MAX_TURNS` (line 4) differs"),
        (lambda c: c.replace("return response.strip()", "return response"), "`parse_action`"),
        (lambda c: c + "\nFORMAT_RETRY_BUDGET = 3\n", "`FORMAT_RETRY_BUDGET` (line 10) was added"),
        (
            lambda c: c.replace('"Answer briefly."', '"Answer " + "briefly."'),
            "SYSTEM_PROMPT (line 2) must be a plain string constant",
        ),
        (
            lambda c: c.replace(
                "def parse_action", "def parse_action(x):\n    return x\n\n\ndef p"
            ),
            "differs",
        ),
    ],
)
def test_prompt_only_violations(edit, message: str) -> None:
    problem = prompt_only_violation(H0, edit(H0))
    assert problem is not None and message in problem, problem


def test_prompt_only_accepts_prompt_text_and_comments() -> None:
    code = H0.replace("Answer briefly.", "Answer with one short phrase.").replace(
        "MAX_TURNS = 2", "MAX_TURNS = 2  # unchanged"
    )
    code = code.replace(
        'USER_PROMPT = "Question: {question}"',
        'USER_PROMPT = (\n    "Question: {question}\\n"\n    "Think first."\n)',
    )
    assert prompt_only_violation(H0, code) is None
    # adding a system prompt where the parent had none is a prompt change too
    bare = H0.replace('SYSTEM_PROMPT = "Answer briefly."\n', "")
    assert prompt_only_violation(bare, H0) is None
    assert "does not parse" in (prompt_only_violation(H0, "def (") or "")
