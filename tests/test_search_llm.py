"""The LLM proposer: archive-confined tools, a replayed tool-calling session, and server faults."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.openai_replay_server import ReplayServer, fault, say, tool_call

from whale_lab.config import ProposerConfig
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.proposers.base import ProposalRequest
from whale_lab.search.proposers.llm import ArchiveTools, LLMProposer, ToolError

REPO = Path(__file__).resolve().parent.parent
H0 = (REPO / "harnesses" / "search" / "h0.py").read_text(encoding="utf-8")
SECRET = "reference answer: Mopejard River"


@pytest.fixture()
def archive(tmp_path: Path) -> PhaseArchive:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    archive = PhaseArchive(tmp_path / "run" / "phase")
    cid = archive.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer="incoming", iteration=1
    )
    archive.write_traces(
        cid,
        [
            {
                "task_id": "search-harness-00001",
                "sample": 0,
                "stop_reason": "format_failure",
                "reward": 0.0,
                "turns": [],
            }
        ],
    )
    archive.write_json(
        cid, "scores", {"success_rate": 0.0, "mean_turns": 2.0, "tokens": 10, "rollouts": 1}
    )
    archive.set_status(cid, "evaluated")
    archive.write_summary()
    return archive


def _request(archive: PhaseArchive, n: int = 2) -> ProposalRequest:
    return ProposalRequest(
        archive=archive, n=n, domain="search", iteration=2, default_parent="c000"
    )


def _cfg(server: ReplayServer, **kw) -> ProposerConfig:
    base = dict(
        kind="llm",
        base_url=server.base_url,
        model="replay-model",
        api_key_env="WHALE_TEST_PROPOSER_KEY",
        request_timeout_s=5.0,
        max_retries=2,
        price_per_million_input=2.0,
        price_per_million_output=10.0,
    )
    base.update(kw)
    return ProposerConfig(**base)


def _tool_results(server: ReplayServer, request_index: int) -> list[str]:
    msgs = server.requests[request_index]["messages"]
    out = []
    for m in reversed(msgs):
        if m["role"] != "tool":
            break
        out.append(m["content"])
    return list(reversed(out))


# ---------------------------------------------------------------- path confinement


def test_tools_refuse_paths_outside_the_archive(archive: PhaseArchive, tmp_path: Path) -> None:
    root = archive.root
    outside = tmp_path / "outside"
    os.symlink(outside / "secret.txt", root / "leak.txt")
    os.symlink(outside, root / "leakdir")
    os.symlink(root / "summary.md", root / "inside-link.md")  # a link that stays inside is fine
    tools = ArchiveTools(root)
    for bad, why in [
        ("../outside/secret.txt", "'..' is not allowed"),
        ("candidates/../../outside/secret.txt", "'..' is not allowed"),
        ("candidates\\..\\..\\x", "'..' is not allowed"),
        (str(outside / "secret.txt"), "absolute paths"),
        ("/etc/passwd", "absolute paths"),
        ("~/secret.txt", "absolute paths"),
        ("leak.txt", "outside the archive"),
        ("leakdir/secret.txt", "outside the archive"),
    ]:
        with pytest.raises(ToolError, match=why):
            tools.read_file(bad)
    with pytest.raises(ToolError, match="outside the archive"):
        tools.list_files("leakdir")
    with pytest.raises(ToolError, match="outside the archive"):
        tools.grep("Mopejard", "leakdir")
    listing = tools.list_files(".")
    assert "leak" not in listing and "candidates/" in listing and "inside-link.md" in listing
    assert tools.grep("Mopejard") == "(no matches)"
    assert "Candidates" in tools.read_file("inside-link.md")


def test_read_offset_limit_and_grep(archive: PhaseArchive) -> None:
    tools = ArchiveTools(archive.root)
    text = tools.read_file("candidates/c000/harness.py", offset=2, limit=3)
    lines = H0.splitlines()
    assert text.splitlines()[1:4] == lines[2:5]
    assert "lines 3-5 of" in text and "[more: read with offset=5]" in text
    hits = tools.grep(r"MAX_TURNS\s*=", "candidates")
    line = next(i for i, ln in enumerate(lines, 1) if ln.startswith("MAX_TURNS ="))
    assert f"candidates/c000/harness.py:{line}: MAX_TURNS = 2" in hits.splitlines()
    with pytest.raises(ToolError, match="bad regular expression"):
        tools.grep("(")
    with pytest.raises(ToolError, match="not a file"):
        tools.read_file("candidates")


# ---------------------------------------------------------------- a replayed session

NEW_CODE = H0.replace("MAX_TURNS = 2", "MAX_TURNS = 4")
PROMPT_CODE = H0.replace("Answer the question.", "Answer the question in a few words.")


def test_llm_session_end_to_end(archive: PhaseArchive, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WHALE_TEST_PROPOSER_KEY", "sk-test-123")
    script = [
        say(tool_call("list_files", {"path": "."})),
        say(
            tool_call("read_file", {"path": "summary.md"}),
            tool_call("grep", {"pattern": "format_failure", "path": "candidates"}),
        ),
        say(
            tool_call("read_file", {"path": "../outside/secret.txt"}),
            tool_call("read_file", {"path": "/etc/passwd"}),
            tool_call("read_file", {"path": "candidates/c000/harness.py", "offset": 0, "limit": 4}),
        ),
        say(tool_call("read_file", '{"path": "summary.md"')),  # malformed arguments
        say(
            tool_call(
                "write_candidate",
                {"code": "def (", "hypothesis": "x", "parent": "c000", "surface": "parser"},
            )
        ),
        say(
            tool_call(
                "write_candidate",
                {
                    "code": NEW_CODE,
                    "hypothesis": "c000/search-harness-00001#0 hit the turn cap.",
                    "parent": "c000",
                    "surface": "termination",
                    "cited_traces": ["c000/search-harness-00001#0"],
                },
            )
        ),
        say(
            tool_call(
                "write_candidate",
                {
                    "code": PROMPT_CODE,
                    "hypothesis": "Shorter answers match exactly.",
                    "parent": "c000",
                    "surface": "prompts",
                },
            )
        ),
        say(content="should not be reached"),
    ]
    with ReplayServer(script) as server:
        proposer = LLMProposer(_cfg(server), backoff_s=0.01)
        session = proposer.propose(_request(archive, n=2))
        proposer.close()
    assert session.error == ""
    assert [c.surface for c in session.candidates] == ["termination", "prompts"]
    assert session.candidates[0].code == NEW_CODE
    assert session.candidates[0].cited_traces == ("c000/search-harness-00001#0",)
    assert len(server.requests) == 7 and len(server.script) == 1
    first = server.requests[0]
    assert first["model"] == "replay-model"
    assert {t["function"]["name"] for t in first["tools"]} == {
        "list_files",
        "read_file",
        "grep",
        "write_candidate",
    }
    assert "One mechanism per candidate" in first["messages"][0]["content"]
    assert server.headers[0]["authorization"] == "Bearer sk-test-123"
    assert "candidates/" in _tool_results(server, 1)[0]
    summary, grep = _tool_results(server, 2)
    assert "| c000 |" in summary and "traces.jsonl" in grep
    leak, absolute, code = _tool_results(server, 3)
    assert "refused" in leak and "refused" in absolute and SECRET not in leak
    assert "It asks for <search>query</search>" in code or "Base search harness" in code
    assert "not valid JSON" in _tool_results(server, 4)[0]
    assert "does not parse" in _tool_results(server, 5)[0]
    assert "accepted as proposal 1 of 2" in _tool_results(server, 6)[0]
    u = session.usage
    assert (u.prompt_tokens, u.completion_tokens, u.requests) == (700, 140, 7)
    assert u.tool_calls == 10
    assert u.cost == pytest.approx((700 * 2.0 + 140 * 10.0) / 1e6)


# ---------------------------------------------------------------- faults

WRITE = tool_call(
    "write_candidate",
    {"code": NEW_CODE, "hypothesis": "turn cap", "parent": "c000", "surface": "termination"},
)


@pytest.mark.parametrize("kind", ["timeout", "500", "malformed", "empty_choices"])
def test_faults_are_retried(archive: PhaseArchive, kind: str) -> None:
    with ReplayServer([fault(kind, delay=1.5), say(WRITE)]) as server:
        proposer = LLMProposer(_cfg(server, request_timeout_s=0.4), backoff_s=0.01)
        session = proposer.propose(_request(archive, n=1))
    assert session.error == "" and len(session.candidates) == 1
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("500", "HTTP 500"),
        ("malformed", "malformed JSON"),
        ("empty_choices", "no choices"),
        ("timeout", "timed out"),
    ],
)
def test_persistent_faults_end_the_session_with_a_reason(
    archive: PhaseArchive, kind: str, message: str
) -> None:
    with ReplayServer([fault(kind, delay=1.0)] * 3) as server:
        proposer = LLMProposer(_cfg(server, request_timeout_s=0.3, max_retries=2), backoff_s=0.01)
        session = proposer.propose(_request(archive, n=1))
    assert session.candidates == ()
    assert message in session.error and "3 attempts" in session.error


def test_server_down_and_client_errors(archive: PhaseArchive) -> None:
    cfg = ProposerConfig(kind="llm", base_url="http://127.0.0.1:9/v1", model="m", max_retries=1)
    session = LLMProposer(cfg, backoff_s=0.01).propose(_request(archive, n=1))
    assert "cannot reach" in session.error
    with pytest.raises(ValueError, match="proposer.model is empty"):
        LLMProposer(ProposerConfig(kind="llm"))


def test_budgets_stop_the_session(archive: PhaseArchive) -> None:
    chatter = [say(tool_call("list_files", {})) for _ in range(5)]
    with ReplayServer(chatter) as server:
        session = LLMProposer(_cfg(server, max_tool_calls=2), backoff_s=0.01).propose(
            _request(archive, n=1)
        )
    assert "tool-call budget (2)" in session.note and session.usage.tool_calls == 2
    big = [say(tool_call("list_files", {}), usage=(150_000, 100_000)) for _ in range(3)]
    with ReplayServer(big) as server:
        session = LLMProposer(_cfg(server, max_tokens=200_000), backoff_s=0.01).propose(
            _request(archive, n=1)
        )
    assert "token budget" in session.note and len(server.requests) == 1
    with ReplayServer([fault("timeout", delay=2.0), say(WRITE)]) as server:
        session = LLMProposer(
            _cfg(server, max_seconds=0.5, request_timeout_s=5.0), backoff_s=0.01
        ).propose(_request(archive, n=1))
    assert "wall-time budget" in session.error and session.candidates == ()


def test_empty_session_is_recorded(archive: PhaseArchive) -> None:
    with ReplayServer([say(content="I have no idea."), say(content="Still nothing.")]) as server:
        session = LLMProposer(_cfg(server), backoff_s=0.01).propose(_request(archive, n=1))
    assert session.candidates == () and session.error == ""
    assert "ended the session" in session.note
    nudge = server.requests[1]["messages"][-1]
    assert nudge["role"] == "user" and "write_candidate" in nudge["content"]
    assert json.dumps(server.requests[0]).count("write_candidate") >= 1
