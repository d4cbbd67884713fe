"""The manual proposer (dropped files, $EDITOR), the claude-code proposer, and the registry."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from whale_lab.config import config_from_dict
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.proposers import make_proposer
from whale_lab.search.proposers.base import ProposalRequest
from whale_lab.search.proposers.claude_code import ClaudeCodeProposer
from whale_lab.search.proposers.manual import ManualProposer
from whale_lab.search.proposers.rules import RulesProposer

REPO = Path(__file__).resolve().parent.parent
H0 = (REPO / "harnesses" / "search" / "h0.py").read_text(encoding="utf-8")


@pytest.fixture()
def archive(tmp_path: Path) -> PhaseArchive:
    archive = PhaseArchive(tmp_path / "phase")
    archive.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer="incoming", iteration=1
    )
    archive.write_summary()
    return archive


def _request(archive: PhaseArchive, n: int = 2) -> ProposalRequest:
    return ProposalRequest(
        archive=archive, n=n, domain="search", iteration=2, default_parent="c000"
    )


def test_manual_dropped_files(archive: PhaseArchive) -> None:
    archive.inbox.mkdir()
    (archive.inbox / "turns.py").write_text(
        "# parent: c000\n" + H0.replace("MAX_TURNS = 2", "MAX_TURNS = 3")
    )
    (archive.inbox / "turns.md").write_text("Three turns let two-hop questions finish.")
    (archive.inbox / "orphan.py").write_text("# parent: c042\n" + H0)
    session = ManualProposer(editor="").propose(_request(archive))
    (cand,) = session.candidates
    assert cand.parent_id == "c000" and cand.surface == "termination"
    assert cand.hypothesis == "Three turns let two-hop questions finish."
    assert "orphan.py: parent 'c042' is not a candidate" in session.note
    assert (
        not list(archive.inbox.glob("*.py")) and len(list((archive.inbox / "taken").iterdir())) == 3
    )
    empty = ManualProposer(editor="").propose(_request(archive))
    assert empty.candidates == () and "drop a harness file into" in empty.note


def test_manual_editor(archive: PhaseArchive) -> None:
    editor = "sed -i 's/MAX_TURNS = 2/MAX_TURNS = 3/; s/^# hypothesis: $/# hypothesis: more turns/'"
    session = ManualProposer(editor=editor).propose(_request(archive, n=1))
    (cand,) = session.candidates
    assert "MAX_TURNS = 3" in cand.code and "# parent:" not in cand.code
    assert cand.hypothesis == "more turns" and cand.surface == "termination"
    unchanged = ManualProposer(editor="true").propose(_request(archive, n=1))
    assert unchanged.candidates == ()


def test_claude_code_skips_cleanly_when_absent(archive: PhaseArchive, monkeypatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    session = ClaudeCodeProposer().propose(_request(archive))
    assert session.candidates == () and session.error == ""
    assert "not installed" in session.note


CLI_REPLAY = r"""#!/bin/sh
# Replays the file protocol of the `claude` CLI: read the archive, write one proposal.
set -e
test -f CLAUDE.md && test -f .claude/skills/harness-proposer/SKILL.md
mkdir -p proposals/p1
test -f archive/summary.md && test ! -e archive/inbox
sed 's/MAX_TURNS = 2/MAX_TURNS = 4/' archive/candidates/c000/harness.py > proposals/p1/harness.py
echo "Four turns; cited c000/t1#0." > proposals/p1/hypothesis.md
echo '{"parent": "c000", "surface": "termination", "cited_traces": ["c000/t1#0"]}' > proposals/p1/meta.json
echo '{"type": "result", "num_turns": 3, "total_cost_usd": 0.0123, "usage": {"input_tokens": 1000, "output_tokens": 200}}'
"""


def test_claude_code_session_folder_and_collection(
    archive: PhaseArchive, tmp_path: Path, monkeypatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "claude"
    exe.write_text(CLI_REPLAY)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (archive.root / "inbox").mkdir()
    (archive.root / "inbox" / "draft.py").write_text("x = 1\n")
    proposer = ClaudeCodeProposer(max_seconds=30)
    workdir = tmp_path / "work"
    proposer.prepare(_request(archive), workdir)
    assert sorted(p.name for p in workdir.iterdir()) == [
        ".claude",
        "CLAUDE.md",
        "archive",
        "proposals",
    ]
    assert "One mechanism per candidate" in (workdir / "CLAUDE.md").read_text()
    assert not (workdir / "archive" / "inbox").exists()
    session = proposer.propose(_request(archive))
    assert session.error == "", session.error
    (cand,) = session.candidates
    assert "MAX_TURNS = 4" in cand.code and cand.surface == "termination"
    assert cand.cited_traces == ("c000/t1#0",)
    u = session.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cost) == (1000, 200, 0.0123)


def test_make_proposer() -> None:
    assert isinstance(make_proposer(config_from_dict({})), RulesProposer)
    assert make_proposer(config_from_dict({"proposer": {"kind": "manual"}})).name == "manual"
    assert (
        make_proposer(config_from_dict({"proposer": {"kind": "claude-code"}})).name == "claude-code"
    )
    with pytest.raises(ValueError, match="proposer.model is empty"):
        make_proposer(config_from_dict({"proposer": {"kind": "llm"}}))
    llm = make_proposer(config_from_dict({"proposer": {"kind": "llm", "model": "m"}}))
    assert llm.name == "llm"
