"""The LLM proposer's client against real local servers: budgets that hold, caps, transcripts, replay.

Every server here is stdlib `http.server` on 127.0.0.1 in a thread: one that trickles a reply a byte
at a time, a one-worker server that is slow once, one that answers 9 MB, and the scripted replay
server of the other proposer tests.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fixtures.openai_replay_server import ReplayServer, say, tool_call

from whale_lab.config import ConfigError, ProposerConfig, config_from_dict
from whale_lab.search.archive import (
    MAX_CANDIDATE_CHARS,
    TRANSCRIPT_FILE,
    ArchiveError,
    PhaseArchive,
)
from whale_lab.search.proposers import make_proposer
from whale_lab.search.proposers.base import ProposalRequest
from whale_lab.search.proposers.chat_client import (
    MAX_REQUEST_BYTES,
    ChatClient,
    ProposerHTTPError,
    RequestTooLarge,
)
from whale_lab.search.proposers.llm import ArchiveTools, LLMProposer, ToolError
from whale_lab.search.proposers.replay import ReplayProposer
from whale_lab.search.proposers.transcript import FIELD_CHARS

REPO = Path(__file__).resolve().parent.parent
H0_PATH = REPO / "harnesses" / "search" / "h0.py"
H0 = H0_PATH.read_text(encoding="utf-8")
SECRET = "reference answer: Mopejard River"
NEW_CODE = H0.replace("MAX_TURNS = 2", "MAX_TURNS = 4")
PROMPT_CODE = H0.replace("Answer the question.", "Answer the question in a few words.")


# ---------------------------------------------------------------- local servers


class LocalServer:
    """`handler` on 127.0.0.1 in a thread; `threaded=False` serves one request at a time."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], threaded: bool = True) -> None:
        cls = ThreadingHTTPServer if threaded else HTTPServer
        self.httpd = cls(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True  # type: ignore[attr-defined]
        self.httpd.log = []  # type: ignore[attr-defined]
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def log(self) -> list[dict[str, Any]]:
        return self.httpd.log  # type: ignore[attr-defined]

    def __enter__(self) -> LocalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def _record(self, **kw: Any) -> dict[str, Any]:
        entry = {"method": self.command, "path": self.path, "start": time.monotonic(), **kw}
        self.server.log.append(entry)  # type: ignore[attr-defined]
        return entry

    def _json(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_GET(self) -> None:  # noqa: N802 - http.server API
        self._record()
        self._json(200, {"object": "list", "data": [{"id": "m"}]})


def _completion(content: str = "done") -> dict[str, Any]:
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }


class Trickle(_Base):
    """Headers at once, then one byte every 0.5 s, for as long as the client listens."""

    def do_POST(self) -> None:  # noqa: N802
        self._body()
        entry = self._record()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            while True:
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            entry["gone"] = time.monotonic()


class SlowOnce(_Base):
    """A one-worker server: the first completion takes 1.2 s, later ones answer at once."""

    def do_POST(self) -> None:  # noqa: N802
        self._body()
        entry = self._record()
        posts = [e for e in self.server.log if e["method"] == "POST"]  # type: ignore[attr-defined]
        if len(posts) == 1:
            time.sleep(1.2)
        entry["end"] = time.monotonic()
        self._json(200, _completion("ok"))


class Huge(_Base):
    """A 9 MB reply (over the response size cap)."""

    def do_POST(self) -> None:  # noqa: N802
        self._body()
        self._record()
        self._json(200, {**_completion("x" * 9_000_000)})


# ---------------------------------------------------------------- fixtures


@pytest.fixture()
def archive(tmp_path: Path) -> PhaseArchive:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text(SECRET)
    archive = PhaseArchive(tmp_path / "run" / "phase")
    cid = archive.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer="incoming", iteration=1
    )
    archive.set_status(cid, "evaluated")
    archive.write_summary()
    return archive


def _request(archive: PhaseArchive, n: int = 1, iteration: int = 2) -> ProposalRequest:
    return ProposalRequest(
        archive=archive, n=n, domain="search", iteration=iteration, default_parent="c000"
    )


def _cfg(base_url: str, **kw: Any) -> ProposerConfig:
    base: dict[str, Any] = dict(
        kind="llm", base_url=base_url, model="m", api_key_env="", request_timeout_s=5.0,
        max_retries=2,
    )
    base.update(kw)
    return ProposerConfig(**base)


def _write(code: str = NEW_CODE, surface: str = "termination", **kw: Any) -> dict:
    args = {"code": code, "hypothesis": f"{surface} change", "parent": "c000", "surface": surface}
    return tool_call("write_candidate", {**args, **kw})


# ---------------------------------------------------------------- deadlines


def test_a_trickling_body_ends_the_session_at_its_deadline(archive: PhaseArchive) -> None:
    with LocalServer(Trickle) as server:
        proposer = LLMProposer(
            _cfg(server.base_url, max_seconds=3.0, request_timeout_s=60.0, max_retries=3),
            backoff_s=0.05,
        )
        t0 = time.monotonic()
        session = proposer.propose(_request(archive))
        elapsed = time.monotonic() - t0
        time.sleep(1.2)  # the server notices the closed connection at its next byte
        proposer.close()
        posts = [e for e in server.log if e["method"] == "POST"]
    assert 2.0 <= elapsed <= 4.0, elapsed
    assert session.candidates == () and "wall-time budget" in session.error
    assert len(posts) == 1 and "gone" in posts[0]  # cancelled, not left trickling
    assert posts[0]["gone"] - t0 <= elapsed + 1.5


def test_a_timed_out_request_waits_for_the_one_worker_server(tmp_path: Path) -> None:
    with LocalServer(SlowOnce, threaded=False) as server:
        client = ChatClient(
            server.base_url, request_timeout_s=0.4, max_retries=4, backoff_s=0.05,
            probe_timeout_s=0.2,
        )
        data = client.complete({"model": "m", "messages": []}, time.monotonic() + 10)
        client.close()
    assert data["choices"][0]["message"]["content"] == "ok"
    posts = [e for e in server.log if e["method"] == "POST"]
    # the abandoned request and one retry, sent after the first was done: nothing stacked
    assert len(posts) == 2 and client.abandoned == 1
    assert posts[1]["start"] >= posts[0]["end"]
    assert any(e["method"] == "GET" and e["path"] == "/v1/models" for e in server.log)


def test_request_and_response_size_caps(archive: PhaseArchive) -> None:
    with LocalServer(Huge) as server:
        client = ChatClient(server.base_url, max_retries=3, backoff_s=0.01)
        big = {"messages": [{"role": "user", "content": "x" * (MAX_REQUEST_BYTES + 10)}]}
        with pytest.raises(RequestTooLarge, match="request size cap"):
            client.complete(big, time.monotonic() + 5)
        assert server.log == []
        with pytest.raises(ProposerHTTPError, match="response size cap.*after 1 attempt"):
            client.complete({"messages": []}, time.monotonic() + 5)
        client.close()
        assert len(server.log) == 1  # over the cap is not retried


# ---------------------------------------------------------------- tool-call and token budgets


def test_three_thousand_tool_calls_run_at_most_the_budget(
    archive: PhaseArchive, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    real = ArchiveTools.list_files
    monkeypatch.setattr(ArchiveTools, "list_files", lambda self, p=".": ran.append(p) or real(self, p))
    calls = [tool_call("list_files", {"path": "."}, call_id=f"c{i}") for i in range(3000)]
    with ReplayServer([say(*calls), say(_write())]) as server:
        session = LLMProposer(_cfg(server.base_url, max_tool_calls=5), backoff_s=0.01).propose(
            _request(archive)
        )
    assert len(ran) == 5 and session.usage.tool_calls == 5
    assert len(server.requests) == 1 and session.candidates == ()
    assert "tool-call budget (5) spent" in session.note and "3000 calls, 5 ran" in session.note
    transcript = json.loads(archive.session_path(2).read_text())
    reply = next(e for e in transcript["entries"] if e["kind"] == "reply")
    assert reply["tool_calls_total"] == 3000 and len(reply["tool_calls"]) == 64
    assert sum(e["kind"] == "tool" for e in transcript["entries"]) == 5


def test_max_tokens_in_every_request_and_a_token_budget_that_holds(archive: PhaseArchive) -> None:
    chatter = [say(tool_call("list_files", {})) for _ in range(3)] + [say(_write())]
    with ReplayServer(chatter) as server:
        session = LLMProposer(_cfg(server.base_url), backoff_s=0.01).propose(_request(archive))
    assert len(session.candidates) == 1 and len(server.requests) == 4
    assert [r["max_tokens"] for r in server.requests] == [2048] * 4
    with ReplayServer(list(chatter)) as server:
        LLMProposer(_cfg(server.base_url, request_max_tokens=77), backoff_s=0.01).propose(
            _request(archive, iteration=3)
        )
    assert [r["max_tokens"] for r in server.requests] == [77] * 4
    # a session budget smaller than one reply: each request asks only for what is left
    steps = [say(tool_call("list_files", {}), usage=(1500, 400)) for _ in range(5)]
    with ReplayServer(steps) as server:
        session = LLMProposer(
            _cfg(server.base_url, max_tokens=4500, request_max_tokens=4000), backoff_s=0.01
        ).propose(_request(archive, iteration=4))
    asked = [r["max_tokens"] for r in server.requests]
    assert len(asked) == 2 and 3000 < asked[0] < 4000 and 0 < asked[1] < asked[0]
    assert session.usage.prompt_tokens + session.usage.completion_tokens <= 4500
    assert "token budget (4500) spent" in session.note


def test_config_validates_the_new_keys() -> None:
    cfg = config_from_dict({"proposer": {"request_max_tokens": 512, "concurrency": 2}})
    assert (cfg.proposer.request_max_tokens, cfg.proposer.concurrency) == (512, 2)
    assert ProposerConfig().request_max_tokens == 2048 and ProposerConfig().concurrency == 1
    for key, bad in [("request_max_tokens", 0), ("concurrency", 0), ("request_max_tokens", "x")]:
        with pytest.raises(ConfigError, match=f"proposer.{key}"):
            config_from_dict({"proposer": {key: bad}})


# ---------------------------------------------------------------- files the tools refuse


def test_hard_links_and_special_files_are_refused(archive: PhaseArchive, tmp_path: Path) -> None:
    root = archive.root
    os.link(tmp_path / "outside" / "secret.txt", root / "candidates" / "c000" / "notes.txt")
    os.mkfifo(root / "pipe")
    os.symlink(root / "candidates" / "c000" / "notes.txt", root / "via-link.txt")
    tools = ArchiveTools(root)
    with pytest.raises(ToolError, match="hard link"):
        tools.read_file("candidates/c000/notes.txt")
    with pytest.raises(ToolError, match="hard link"):
        tools.read_file("via-link.txt")  # a symlink inside to the hard link
    with pytest.raises(ToolError, match="hard link"):
        tools.grep("Mopejard", "candidates/c000/notes.txt")
    with pytest.raises(ToolError, match="hard link"):
        tools.list_files("candidates/c000/notes.txt")
    t0 = time.monotonic()
    with pytest.raises(ToolError, match="not a regular file"):
        tools.read_file("pipe")  # refused at once, not blocked on the fifo
    assert time.monotonic() - t0 < 1.0
    assert tools.grep("Mopejard") == "(no matches)"
    listing = tools.list_files(".") + tools.list_files("candidates/c000")
    assert "notes.txt" not in listing and "pipe" not in listing and "harness.py" in listing
    assert "MAX_TURNS" in tools.read_file("candidates/c000/harness.py")


# ---------------------------------------------------------------- size cap at write time


def test_a_ten_megabyte_candidate_is_refused_when_written(archive: PhaseArchive) -> None:
    huge = H0 + "\n# " + "x" * 10_000_000 + "\n"
    with pytest.raises(ArchiveError, match="too large .*at most"):
        archive.add_candidate(
            huge, parent_id="c000", hypothesis="h", surface="prompts", proposer="p", iteration=2
        )
    assert archive.ids() == ["c000"] and archive.next_id() == "c001"
    proposer = LLMProposer(_cfg("http://127.0.0.1:9/v1"))
    tools = ArchiveTools(archive.root)
    from whale_lab.search.proposers.llm import _Session

    sess = _Session(archive, 1, "c000")
    result = proposer._run_tool(_write(code=huge), tools, sess)
    assert "too large" in result and f"{MAX_CANDIDATE_CHARS:,}" in result and sess.candidates == []
    # over HTTP: a reply with an oversized candidate hears why, and the next one is taken
    big = H0 + "\n# " + "y" * (MAX_CANDIDATE_CHARS + 10) + "\n"
    with ReplayServer([say(_write(code=big)), say(_write())]) as server:
        session = LLMProposer(_cfg(server.base_url), backoff_s=0.01).propose(_request(archive))
    assert len(session.candidates) == 1 and session.candidates[0].code == NEW_CODE
    tool_msg = server.requests[1]["messages"][-1]
    assert tool_msg["role"] == "tool" and "too large" in tool_msg["content"]


# ---------------------------------------------------------------- transcript and replay


def _record_session(archive: PhaseArchive, tmp_path: Path) -> list[str]:
    """An LLM session over HTTP whose candidates are added as the phase adds them."""
    (archive.root / "big.txt").write_text("line\n" * 20000)
    script = [
        say(tool_call("read_file", {"path": "big.txt", "limit": 1600})),
        say(_write(), _write(code=PROMPT_CODE, surface="prompts")),
    ]
    with ReplayServer(script) as server:
        session = LLMProposer(_cfg(server.base_url), backoff_s=0.01).propose(_request(archive, n=2))
    assert len(session.candidates) == 2
    ids = []
    for c in session.candidates:
        ids.append(
            archive.add_candidate(
                c.code, parent_id=c.parent_id, hypothesis=c.hypothesis, surface=c.surface,
                proposer="llm", iteration=2,
            )
        )
    return ids


def test_transcript_is_stored_with_the_candidates(archive: PhaseArchive, tmp_path: Path) -> None:
    ids = _record_session(archive, tmp_path)
    for i, cid in enumerate(ids):
        t = json.loads((archive.folder(cid) / TRANSCRIPT_FILE).read_text())
        assert t["candidate_index"] == i and t["proposer"] == "llm" and t["iteration"] == 2
    kinds = [e["kind"] for e in t["entries"]]
    assert kinds == ["request", "reply", "tool", "request", "reply", "tool", "tool"]
    first = t["entries"][0]
    assert first["max_tokens"] == 2048 and first["messages"][0]["role"] == "system"
    read = t["entries"][2]
    assert read["name"] == "read_file" and "[... cut:" in read["result"]
    assert len(read["result"]) < FIELD_CHARS + 100
    assert "accepted as proposal 2 of 2" in t["entries"][-1]["result"]
    assert t["candidates"][1]["code"] == PROMPT_CODE  # candidates are kept whole
    assert t["usage"]["requests"] == 2


def test_replay_returns_the_recorded_candidates_with_zero_requests(
    archive: PhaseArchive, tmp_path: Path
) -> None:
    _record_session(archive, tmp_path)
    fresh = PhaseArchive(tmp_path / "replayed")
    fresh.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer="incoming", iteration=1
    )
    with ReplayServer([]) as server:
        cfg = config_from_dict(
            {"proposer": {"kind": "llm", "model": "m", "base_url": server.base_url,
                          "replay": str(archive.root)}}
        )
        proposer = make_proposer(cfg)
        assert isinstance(proposer, ReplayProposer)
        session = proposer.propose(_request(fresh, n=2))
        rest = proposer.propose(_request(fresh, n=2, iteration=3))
        assert server.requests == []
    assert [c.code for c in session.candidates] == [NEW_CODE, PROMPT_CODE]
    assert [c.parent_id for c in session.candidates] == ["c000", "c000"]
    assert session.usage.requests == 0 and "replayed session" in session.note
    assert rest.candidates == () and "already replayed" in rest.note
    cid = fresh.add_candidate(
        NEW_CODE, parent_id="c000", hypothesis="h", surface="termination", proposer="replay",
        iteration=2,
    )
    again = json.loads((fresh.folder(cid) / TRANSCRIPT_FILE).read_text())
    assert again["replayed_from"] == str(archive.root) and again["proposer"] == "replay"
    with pytest.raises(ConfigError, match="no recorded proposer session"):
        ReplayProposer(tmp_path / "outside")


# ---------------------------------------------------------------- the phase and the command


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> Iterator[Any]:
    from whale_lab.backends import make_backend

    b = make_backend(config_from_dict({"model": {"path": str(tiny_model_dir)}}))
    yield b
    b.close()


def _search_cfg(tmp_path: Path, **proposer: Any) -> Any:
    return config_from_dict(
        {
            "run": {"directory": str(tmp_path / "runs"), "seed": 0},
            "model": {"path": "tiny-random"},
            "domain": {"name": "search", "harness": str(H0_PATH),
                       "splits": {"weight": 4, "harness": 2, "val": 2, "test": 2}},
            "sampling": {"max_new_tokens": 4, "k": 1},
            "harness_search": {"candidates_per_iteration": 1, "iterations": 2, "smoke_tasks": 1},
            "sandbox": {"call_timeout_s": 0.5},
            "approval": {"mode": "auto"},
            "proposer": {"kind": "llm", "model": "m", "max_retries": 0, **proposer},
        }
    )


def test_search_replays_a_recorded_run_with_zero_requests(tmp_path: Path, backend: Any) -> None:
    from whale_lab.cli import build_parser
    from whale_lab.commands.search import run_search

    with ReplayServer([say(_write(code=PROMPT_CODE, surface="prompts"))]) as server:
        code = run_search(
            _search_cfg(tmp_path / "a", base_url=server.base_url), backend=backend,
            out=io.StringIO(),
        )
    assert code == 0 and len(server.requests) == 1
    first = next((tmp_path / "a" / "runs").iterdir())
    recorded = first / "harness_phases" / "cycle-01" / "candidates" / "c001"
    assert (recorded / TRANSCRIPT_FILE).is_file()
    with ReplayServer([]) as server:
        cfg = _search_cfg(tmp_path / "b", base_url=server.base_url, replay=str(first))
        code = run_search(cfg, backend=backend, out=io.StringIO())
        assert server.requests == []
    assert code == 0
    second = next((tmp_path / "b" / "runs").iterdir())
    replayed = second / "harness_phases" / "cycle-01" / "candidates" / "c001"
    assert (replayed / "harness.py").read_text() == (recorded / "harness.py").read_text()
    assert json.loads((replayed / "meta.json").read_text())["proposer"] == "replay"
    args = build_parser().parse_args(["search", "--replay-proposer", str(first)])
    assert args.replay_proposer == str(first)
    from whale_lab.cli import main

    assert main(["search", "--replay-proposer", str(first), "--resume", str(second)]) == 2


def test_one_iteration_says_the_proposer_is_never_called(tmp_path: Path, backend: Any) -> None:
    from whale_lab.context import RunContext
    from whale_lab.domains import make_domain
    from whale_lab.search.meta_harness import HarnessPhase
    from whale_lab.store import RunStore, read_jsonl

    class Never:
        name = "never"

        def propose(self, request: ProposalRequest) -> Any:
            raise AssertionError("called")

    cfg = _search_cfg(tmp_path)
    store = RunStore(tmp_path / "run")
    phase = HarnessPhase(
        RunContext.of(cfg, backend, make_domain(cfg), store), None, proposer=Never()
    )
    result = phase.run(H0_PATH, iterations=1)
    store.close()
    assert result.status == "completed" and phase.archive.ids() == ["c000"]
    logs = [e for e in read_jsonl(store.root / "events.jsonl") if e["type"] == "log"]
    notes = [e for e in logs if "never calls the proposer" in e["message"]]
    assert len(notes) == 1 and notes[0]["level"] == "warning"
    assert "\n" not in notes[0]["message"]
