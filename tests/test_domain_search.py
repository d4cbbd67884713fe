"""Search domain: encyclopedia, BM25, verifier, splits, actions, episodes, retriever client, h0."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from whale_lab.config import config_from_dict
from whale_lab.domains import make_domain
from whale_lab.domains.base import SPLITS, Action
from whale_lab.domains.bm25 import BM25Index, tokenize
from whale_lab.domains.encyclopedia import (
    DEFAULT_CORPUS_SEED,
    build_encyclopedia,
    default_encyclopedia,
)
from whale_lab.domains.loaders import DataError
from whale_lab.domains.retriever_client import RetrieverClient, RetrieverError
from whale_lab.domains.search import BM25Retriever, SearchDomain, verify_search
from whale_lab.domains.text import contains_answer, normalize_answer, token_f1

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"weight": 50, "harness": 20, "val": 20, "test": 20}
HARNESS_IMPORTS = {
    "__future__",
    "collections",
    "dataclasses",
    "functools",
    "itertools",
    "json",
    "math",
    "random",
    "re",
    "statistics",
    "string",
    "textwrap",
    "typing",
}


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"h0_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def domain() -> SearchDomain:
    return SearchDomain.builtin(0, SIZES)


# ------------------------------------------------------------------ verifier


def test_normalisation_and_exact_match() -> None:
    assert normalize_answer("  The Ostrel  River! ") == "ostrel river"
    assert verify_search("the ostrel river.", ["Ostrel River"]) == (True, 1.0)
    assert verify_search("<answer>Ostrel River</answer>", ["Ostrel River"])[0]
    assert verify_search("Ostrel", ["Ostrel River", "Ostrel"])[0]


def test_wrong_and_malformed_answers() -> None:
    em, f1 = verify_search("Varnet River", ["Ostrel River"])
    assert not em and 0.0 < f1 < 1.0
    assert verify_search("", ["Ostrel River"]) == (False, 0.0)
    assert verify_search("the", ["Ostrel River"]) == (False, 0.0)
    assert verify_search("!!!", ["1843"]) == (False, 0.0)
    assert token_f1("1843", ["1843"]) == 1.0


def test_contains_answer_respects_word_boundaries() -> None:
    assert contains_answer("Born in 1843, she was a painter.", ["1843"])
    assert not contains_answer("Born in 18431.", ["1843"])


# ------------------------------------------------------------------ encyclopedia


def test_encyclopedia_is_deterministic_and_consistent() -> None:
    a = build_encyclopedia(5, 60)
    b = build_encyclopedia(5, 60)
    assert [p.text for p in a.passages] == [p.text for p in b.passages]
    assert [q.question for q in a.questions] == [q.question for q in b.questions]
    by_id = {p.id: p for p in a.passages}
    assert len(by_id) == len(a.passages)
    assert len({q.question for q in a.questions}) == len(a.questions)
    assert {q.hops for q in a.questions} == {1, 2}
    for p in a.passages:
        assert p.title and 1 <= len(re.findall(r"[.!?](?:\s|$)", p.text)) <= 3, p.text
    for q in a.questions:
        assert len(q.support) == len(q.queries) == q.hops
        last = by_id[q.support[-1]]
        assert contains_answer(f"{last.title} {last.text}", q.answers), q
        if q.hops == 2:
            first = by_id[q.support[0]]
            assert not contains_answer(first.text, q.answers), q  # needs the second hop
            assert contains_answer(first.text, [q.bridge])


def test_pretraining_world_is_disjoint() -> None:
    main = default_encyclopedia()
    other = build_encyclopedia(DEFAULT_CORPUS_SEED + 1, 200, avoid=main.name_words)
    assert main.name_words and other.name_words
    assert not (main.name_words & other.name_words)
    main_titles = {p.title for p in main.passages}
    assert not main_titles & {p.title for p in other.passages}
    with pytest.raises(ValueError):
        build_encyclopedia(0, 5)


# ------------------------------------------------------------------ BM25


def test_bm25_basics() -> None:
    docs = [
        "Ostrel River flows into the Sellic Sea",
        "Brisolt is a town on the Ostrel River",
        "Velka Tormund was born in Brisolt",
    ]
    index = BM25Index(docs)
    assert tokenize("The Ostrel, river!") == ["ostrel", "river"]
    assert index.search("Where was Velka Tormund born?", 1)[0][0] == 2
    assert index.search("Sellic", 5) == [(0, pytest.approx(index.search("Sellic", 1)[0][1]))]
    assert index.search("the of a", 3) == []
    assert index.search("Ostrel", 0) == []
    assert len(index.search("Ostrel River Brisolt", 10)) == 3


def test_bm25_ranks_the_entity_passage_first() -> None:
    enc = default_encyclopedia()
    by_id = {p.id: p for p in enc.passages}
    retriever = BM25Retriever(enc.passage_dicts())
    one_hop = [q for q in enc.questions if q.hops == 1][:300]
    hits = 0
    for q in one_hop:
        top = retriever.search(q.question, 1)[0]
        hits += top["title"] == by_id[q.support[0]].title
    assert hits / len(one_hop) > 0.97
    q = one_hop[0]
    top = retriever.search(q.queries[0], 3)
    assert top[0]["title"] == by_id[q.support[0]].title
    assert set(top[0]) == {"id", "title", "text", "score"}
    assert top[0]["score"] >= top[1]["score"] >= top[2]["score"]


# ------------------------------------------------------------------ splits


def test_splits_disjoint_deterministic_and_mixed(domain: SearchDomain) -> None:
    again = SearchDomain.builtin(0, SIZES)
    other = SearchDomain.builtin(1, SIZES)
    seen: list[str] = []
    for s in SPLITS:
        tasks = domain.tasks(s)
        assert len(tasks) == SIZES[s]
        assert [t.fields["question"] for t in tasks] == [
            t.fields["question"] for t in again.tasks(s)
        ]
        two = sum(t.meta["hops"] == 2 for t in tasks)
        assert two == round(SIZES[s] * 0.4)
        seen += [t.fields["question"] for t in tasks]
        for t in tasks:
            assert set(t.fields) == {"question"} and isinstance(t.answer, list) and t.answer
    assert len(seen) == len(set(seen))
    assert [t.fields["question"] for t in other.tasks("test")] != [
        t.fields["question"] for t in domain.tasks("test")
    ]


def test_too_many_tasks_is_a_clear_error() -> None:
    with pytest.raises(DataError, match="built-in encyclopedia has"):
        SearchDomain.builtin(0, {"weight": 10, "harness": 5000, "val": 10, "test": 10})


def test_from_config_through_registry() -> None:
    cfg = config_from_dict({"domain": {"name": "search", "splits": SIZES}})
    dom = make_domain(cfg)
    assert isinstance(dom, SearchDomain)
    assert [len(dom.tasks(s)) for s in SPLITS] == [SIZES[s] for s in SPLITS]


def test_question_file_without_corpus_is_an_error(tmp_path: Path) -> None:
    qfile = tmp_path / "q.jsonl"
    qfile.write_text(json.dumps({"question": "q?", "answer": "a"}) + "\n")
    cfg = config_from_dict({"domain": {"name": "search", "source": str(qfile)}})
    with pytest.raises(DataError, match="domain.corpus"):
        SearchDomain.from_config(cfg)


# ------------------------------------------------------------------ actions


def test_normalise_action_forms(domain: SearchDomain) -> None:
    norm = domain.normalise_action
    assert norm("Brisolt") == Action(kind="answer", value="Brisolt")
    a = norm({"type": "tool", "name": "search", "arguments": {"query": " who? "}})
    assert (a.kind, a.tool, dict(a.args)) == ("tool", "search", {"query": "who?", "topk": 3})
    assert (
        norm({"type": "tool", "name": "search", "arguments": {"query": "x", "topk": 50}}).args[
            "topk"
        ]
        == 10
    )
    assert (
        norm({"type": "tool", "name": "search", "arguments": {"query": "x", "topk": "2"}}).args[
            "topk"
        ]
        == 2
    )
    assert (
        norm({"type": "tool", "name": "search", "arguments": "plain query"}).args["query"]
        == "plain query"
    )
    for raw in [
        None,
        "  ",
        {"type": "tool", "name": "python", "arguments": {"code": "1"}},
        {"type": "tool", "name": "search", "arguments": {"query": ""}},
        {"type": "tool", "name": "search", "arguments": {"query": "x", "topk": "many"}},
        {"type": "answer", "content": ""},
        {"type": "move", "move": "e2e4"},
        3.5,
    ]:
        action = norm(raw)
        assert action.kind == "invalid" and action.reason, raw


# ------------------------------------------------------------------ episodes


def test_one_hop_episode(domain: SearchDomain) -> None:
    task = next(t for t in domain.tasks("test") if t.meta["hops"] == 1)
    env = domain.make_env(task)
    assert env.initial_observation() is None and env.context() == {}
    out = env.step(
        domain.normalise_action(
            {"type": "tool", "name": "search", "arguments": {"query": task.meta["queries"][0]}}
        )
    )
    assert not out.done and out.observation["query"] == task.meta["queries"][0]
    assert len(out.observation["passages"]) == 3
    assert out.info["answer_in_results"]
    done = env.step(domain.normalise_action({"type": "answer", "content": task.answer[0]}))
    assert done.done and done.reward == 1.0 and done.stop_reason == "answered"
    assert done.info["em"] and done.info["f1"] == 1.0
    info = env.final_info()
    assert info["retrieval_recall"] is True and info["searches"] == 1 and info["em"]


def test_two_hop_episode_and_wrong_answer(domain: SearchDomain) -> None:
    task = next(t for t in domain.tasks("val") if t.meta["hops"] == 2)
    env = domain.make_env(task)
    for query in task.meta["queries"]:
        out = env.step(Action(kind="tool", tool="search", args={"query": query, "topk": 3}))
        assert not out.done
    assert env.final_info()["searches"] == 2 and env.final_info()["retrieval_recall"]
    done = env.step(Action(kind="answer", value="Nowhere In Particular"))
    assert done.done and done.reward == 0.0 and not done.info["em"]
    assert env.final_info()["f1"] == 0.0

    fresh = domain.make_env(task)
    fresh.step(Action(kind="tool", tool="search", args={"query": "zzzz qqqq", "topk": 1}))
    assert fresh.final_info()["retrieval_recall"] is False
    fb = fresh.step(Action(kind="move", value="e2e4"))
    assert fb.feedback_kind == "format" and not fb.done


# ------------------------------------------------------------------ retriever client


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"
    seen: list[dict[str, Any]] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if self.path != "/retrieve":
            self.send_response(404)
            self.end_headers()
            return
        if self.mode == "garbage":
            payload = b"<html>not json</html>"
        elif self.mode == "shape":
            payload = json.dumps({"results": []}).encode()
        else:
            result = [
                [
                    {
                        "document": {"id": f"{q}-{i}", "contents": f'"Title {i}"\nText for {q}.'},
                        "score": 1.0 / (i + 1),
                    }
                    for i in range(body["topk"])
                ]
                for q in body["queries"]
            ]
            payload = json.dumps({"result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    _Handler.mode = "ok"
    _Handler.seen = []
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_retriever_client_round_trip(server: str) -> None:
    client = RetrieverClient(server, timeout_s=5)
    results = client.search_many(["alpha", "beta"], topk=2)
    assert _Handler.seen[-1] == {"queries": ["alpha", "beta"], "topk": 2, "return_scores": True}
    assert len(results) == 2 and len(results[0]) == 2
    assert results[1][0] == {
        "id": "beta-0",
        "title": "Title 0",
        "text": "Text for beta.",
        "score": 1.0,
    }
    assert client.search("gamma", 1)[0]["id"] == "gamma-0"
    client.close()


def test_retriever_client_malformed_answers(server: str) -> None:
    client = RetrieverClient(server + "/", timeout_s=5, retries=0)
    _Handler.mode = "garbage"
    with pytest.raises(RetrieverError, match="malformed JSON"):
        client.search("alpha", 1)
    _Handler.mode = "shape"
    with pytest.raises(RetrieverError, match="unexpected shape"):
        client.search("alpha", 1)
    client.close()


def test_retriever_client_server_down() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = RetrieverClient(f"http://127.0.0.1:{port}", timeout_s=2, retries=0)
    with pytest.raises(RetrieverError, match="unreachable"):
        client.search("alpha", 1)
    with pytest.raises(RetrieverError, match="http"):
        RetrieverClient("127.0.0.1:8000")


def test_retriever_url_replaces_bm25(server: str, tmp_path: Path) -> None:
    qfile = tmp_path / "q.jsonl"
    rows = [{"question": f"question {i}?", "golden_answers": [f"Text for q{i}"]} for i in range(8)]
    qfile.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sizes = {"weight": 2, "harness": 2, "val": 2, "test": 2}
    cfg = config_from_dict(
        {
            "domain": {
                "name": "search",
                "source": str(qfile),
                "retriever_url": server,
                "splits": sizes,
            }
        }
    )
    dom = SearchDomain.from_config(cfg)
    task = dom.tasks("test")[0]
    env = dom.make_env(task)
    out = env.step(Action(kind="tool", tool="search", args={"query": "anything", "topk": 2}))
    assert [p["id"] for p in out.observation["passages"]] == ["anything-0", "anything-1"]
    assert _Handler.seen[-1]["topk"] == 2
    dom.close()


# ------------------------------------------------------------------ base harness


def test_search_h0_imports_and_parses(domain: SearchDomain) -> None:
    path = ROOT / "harnesses" / "search" / "h0.py"
    tree = ast.parse(path.read_text())
    imports = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imports |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imports <= HARNESS_IMPORTS
    h0 = load_module(path)
    assert h0.MAX_TURNS == 2
    assert "{question}" in h0.USER_PROMPT
    assert h0.parse_action("<answer> Brisolt </answer>") == {"type": "answer", "content": "Brisolt"}
    call = h0.parse_action("I will look.<search>Velka Tormund born</search>")
    assert call == {
        "type": "tool",
        "name": "search",
        "arguments": {"query": "Velka Tormund born", "topk": 1},
    }
    assert h0.parse_action("no tags here") is None
    assert domain.normalise_action(call).args["topk"] == 1
    obs = {
        "query": "q",
        "passages": [
            {"id": "1", "title": "T", "text": " ".join(f"w{i}" for i in range(30)), "score": 2.0},
            {"id": "2", "title": "U", "text": "second passage", "score": 1.0},
        ],
    }
    shown = h0.format_observation(obs, turn_count=1, max_turns=2)
    # one passage, whole while it is short (the paper's h0 cuts at about 200 tokens)
    assert "w29" in shown and "..." not in shown and "second" not in shown
    long = {"query": "q", "passages": [{"id": "1", "title": "T", "score": 2.0,
                                        "text": " ".join(f"w{i}" for i in range(400))}]}
    cut = h0.format_observation(long, turn_count=1, max_turns=2)
    assert "w149" in cut and "w150" not in cut and cut.endswith("...</information>")
    assert "No results" in h0.format_observation({"query": "q", "passages": []})
    assert h0.format_observation(None) == ""
