"""Data too small for domain.splits, huge split sizes, and byte-order marks, across the domains.

The one rule (`loaders.fit_split_sizes`), the same for math, search and chess and for built-in data
and files: test, val and harness are never shrunk, so data that cannot fill them (and one weight
item) is a DataError naming what exists and what was asked; weight takes what is left, with a
warning that names both numbers.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import config_from_dict
from whale_lab.domains import make_domain
from whale_lab.domains.base import SPLITS
from whale_lab.domains.chess import ChessDomain
from whale_lab.domains.chess_puzzles import (
    load_builtin_puzzles,
    read_puzzles_jsonl,
    write_puzzles_jsonl,
)
from whale_lab.domains.lichess import load_lichess_csv
from whale_lab.domains.loaders import (
    DataError,
    fit_split_sizes,
    load_corpus_file,
    load_math_file,
    load_questions_file,
)
from whale_lab.domains.math import MathDomain
from whale_lab.domains.math_problems import STREAM_CAPACITY, ProblemStream
from whale_lab.domains.search import SearchDomain

BOM = b"\xef\xbb\xbf"


def _jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _sizes(test: int, val: int, harness: int, weight: int) -> dict[str, int]:
    return {"test": test, "val": val, "harness": harness, "weight": weight}


# ------------------------------------------------------------------ the rule itself


def test_fit_split_sizes_error_names_what_exists_and_what_was_asked() -> None:
    with pytest.raises(DataError) as err:
        fit_split_sizes(10, _sizes(4, 4, 2, 5), "f.jsonl: 10 distinct questions", "math")
    text = str(err.value)
    assert text.startswith("f.jsonl: 10 distinct questions, but test, val and harness need 10")
    assert "test=4, val=4, harness=2, weight=5" in text and "\n" not in text


def test_fit_split_sizes_weight_takes_the_rest_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert fit_split_sizes(20, _sizes(2, 2, 2, 5), "x", "math") == (_sizes(2, 2, 2, 5), "")
    with caplog.at_level(logging.WARNING):
        sizes, note = fit_split_sizes(11, _sizes(2, 2, 2, 50), "f: 11 puzzles", "chess")
    assert sizes == _sizes(2, 2, 2, 5)
    assert "only 5 are left for weight, which asks for 50" in note
    assert any(note in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


# ------------------------------------------------------------------ the same rule in every domain


def _math_file(tmp_path: Path, n: int) -> str:
    path = tmp_path / "math.jsonl"
    path.write_bytes(_jsonl([{"question": f"What is {i}+1?", "answer": f"#### {i + 1}"}
                             for i in range(n)]))
    return str(path)


def _search_files(tmp_path: Path, n: int) -> tuple[str, str]:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(_jsonl([{"id": str(i), "title": f"T{i}", "text": f"T{i} is R{i}."}
                               for i in range(n)]))
    questions = tmp_path / "q.jsonl"
    questions.write_bytes(_jsonl([{"question": f"What is T{i}?", "answer": f"R{i}"}
                                  for i in range(n)]))
    return str(questions), str(corpus)


def _chess_file(tmp_path: Path, n: int) -> str:
    path = tmp_path / "puzzles.jsonl"
    write_puzzles_jsonl(load_builtin_puzzles()[:n], path)
    return str(path)


def _domain(tmp_path: Path, name: str, source: str, n: int, sizes: dict[str, int]) -> Any:
    domain: dict[str, Any] = {"name": name, "splits": sizes}
    if source == "file":
        if name == "math":
            domain["source"] = _math_file(tmp_path, n)
        elif name == "search":
            domain["source"], domain["corpus"] = _search_files(tmp_path, n)
        else:
            domain["source"] = _chess_file(tmp_path, n)
    return make_domain(config_from_dict({"domain": domain}))


# (domain, source, items that exist, what the message says exists)
SOURCES = [
    ("math", "file", 12, "12 distinct questions"),
    ("search", "file", 12, "12 distinct questions"),
    ("chess", "file", 12, "12 puzzles"),
    ("search", "builtin", 3852, "the built-in encyclopedia has 3852 questions"),
    ("chess", "builtin", 800, "the built-in puzzle set has 800 puzzles"),
    ("math", "builtin", STREAM_CAPACITY, f"makes at most {STREAM_CAPACITY} distinct problems"),
]


@pytest.mark.parametrize(("name", "source", "n", "have"), SOURCES,
                         ids=[f"{s[0]}-{s[1]}" for s in SOURCES])
def test_too_small_for_the_evaluation_splits_is_an_error(
    tmp_path: Path, name: str, source: str, n: int, have: str
) -> None:
    sizes = _sizes(n // 2, n // 2, 1, 1)
    with pytest.raises(DataError) as err:
        _domain(tmp_path, name, source, n, sizes)
    text = str(err.value)
    assert have in text and f"need {2 * (n // 2) + 1}" in text
    assert f"test={n // 2}, val={n // 2}, harness=1, weight=1" in text


@pytest.mark.parametrize(("name", "source", "n", "have"), SOURCES[:5],
                         ids=[f"{s[0]}-{s[1]}" for s in SOURCES[:5]])
def test_weight_takes_what_is_left_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str, source: str, n: int, have: str
) -> None:
    with caplog.at_level(logging.WARNING):
        dom = _domain(tmp_path, name, source, n, _sizes(3, 3, 2, n + 100))
    got = {s: len(dom.tasks(s)) for s in SPLITS}
    assert got == {"test": 3, "val": 3, "harness": 2, "weight": n - 8}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(have in m and f"only {n - 8} are left for weight, which asks for {n + 100}" in m
               for m in warned), warned
    ids = [t.id for s in SPLITS for t in dom.tasks(s)]
    assert len(ids) == len(set(ids))


def test_math_builtin_weight_shortfall_warns_without_generating(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        dom = MathDomain.builtin(0, _sizes(2, 2, 2, 5_000_000))
    assert any(f"only {STREAM_CAPACITY - 6} are left for weight" in r.getMessage()
               for r in caplog.records)
    assert len(dom.tasks("test")) == 2  # weight (99,994 problems) is not generated for this


# ------------------------------------------------------------------ huge sizes: bounded, lazy


@pytest.mark.timeout(20)
def test_huge_split_sizes_fail_fast_in_every_domain(tmp_path: Path) -> None:
    huge = _sizes(10_000_000, 10_000_000, 10_000_000, 10_000_000)  # the config's upper bound
    for name, source, n, _have in SOURCES:
        started = time.monotonic()
        with pytest.raises(DataError, match="need 30000000"):
            _domain(tmp_path, name, source, n, huge)
        assert time.monotonic() - started < 5, (name, source)


def test_math_builtin_splits_are_generated_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[str] = []
    take = ProblemStream.take

    def spy(self: ProblemStream, label: str, n: int) -> Any:
        made.append(label)
        return take(self, label, n)

    monkeypatch.setattr(ProblemStream, "take", spy)
    sizes = _sizes(3, 4, 5, 300)
    dom = MathDomain.builtin(7, sizes)
    assert made == []
    val = dom.tasks("val")
    assert made == ["test", "val"] and len(val) == 4  # an eval of val never generates weight
    again = MathDomain.builtin(7, sizes)
    weight = again.tasks("weight")  # asked for first: the earlier splits are made first
    assert [t.fields for t in again.tasks("val")] == [t.fields for t in val]
    assert made[2:] == ["test", "val", "harness", "weight"] and len(weight) == 300
    questions = [t.fields["question"] for s in SPLITS for t in again.tasks(s)]
    assert len(questions) == len(set(questions))


def test_math_builtin_matches_eager_generation() -> None:
    """Lazy splits are the lists the generator made before, in the same order."""
    sizes = _sizes(5, 5, 5, 20)
    stream = ProblemStream(3)
    eager = {s: [p.question for p in stream.take(s, sizes[s])] for s in ("test", "val", "harness", "weight")}
    dom = MathDomain.builtin(3, sizes)
    for split in ("weight", "harness", "test", "val"):
        assert [t.fields["question"] for t in dom.tasks(split)] == eager[split]


# ------------------------------------------------------------------ byte-order marks


def test_every_text_loader_accepts_a_byte_order_mark(tmp_path: Path) -> None:
    math_rows = [{"question": "One plus one?", "answer": "#### 2"}]
    (tmp_path / "m.jsonl").write_bytes(BOM + _jsonl(math_rows))
    assert load_math_file(tmp_path / "m.jsonl")[0].answer == "2"
    (tmp_path / "m.json").write_bytes(BOM + json.dumps(math_rows).encode())
    assert load_math_file(tmp_path / "m.json")[0].answer == "2"
    (tmp_path / "lines.json").write_bytes(BOM + _jsonl(math_rows))  # .json holding JSON lines
    assert load_math_file(tmp_path / "lines.json")[0].answer == "2"
    (tmp_path / "c.jsonl").write_bytes(BOM + _jsonl([{"id": "a", "text": "Alpha."}]))
    assert load_corpus_file(tmp_path / "c.jsonl")[0]["id"] == "a"
    (tmp_path / "q.jsonl").write_bytes(BOM + _jsonl([{"question": "Who?", "answer": "A"}]))
    assert load_questions_file(tmp_path / "q.jsonl")[0].answers == ("A",)
    puzzles = tmp_path / "p.jsonl"
    write_puzzles_jsonl(load_builtin_puzzles()[:2], puzzles)
    puzzles.write_bytes(BOM + puzzles.read_bytes())
    assert [p.id for p in read_puzzles_jsonl(puzzles)] == [p.id for p in load_builtin_puzzles()[:2]]
    csv = tmp_path / "lichess.csv"
    csv.write_bytes(BOM + b"PuzzleId,FEN,Moves\n00008,"
                    b"r6k/pp2r2p/4Rp1Q/3p4/8/1N1P2R1/PqP2bPP/7K b - - 0 24,f2g3 e6e7 b2b1 b3c1 b1c1 h6c1\n")
    assert [p.id for p in load_lichess_csv(csv)] == ["00008"]


def test_chess_jsonl_problems_are_one_line_errors(tmp_path: Path) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_bytes(b'{"id": "caf\xe9"}\n')
    with pytest.raises(DataError, match="not UTF-8 text"):
        read_puzzles_jsonl(bad)
    with pytest.raises(DataError, match="not a file"):
        read_puzzles_jsonl(tmp_path)
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError, match="nested too deeply"):
        read_puzzles_jsonl(deep)
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"id": "x", "fen": "8/8/8/8/8/8/8/8 w - - 0 1", "moves": [],
                               "themes": 5}) + "\n")
    with pytest.raises(DataError, match="'themes' must be a list"):
        read_puzzles_jsonl(odd, replay=False)


def test_deeply_nested_json_lines_are_one_line_errors(tmp_path: Path) -> None:
    for name in ("deep.jsonl", "deep.json"):
        path = tmp_path / name
        path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
        with pytest.raises(DataError, match="nested too deeply"):
            load_math_file(path)


def test_search_file_and_chess_domain_objects_stay_usable(tmp_path: Path) -> None:
    """The rule changed how sizes are chosen, not what a domain built from enough data holds."""
    dom = _domain(tmp_path, "search", "file", 12, _sizes(2, 2, 2, 6))
    assert isinstance(dom, SearchDomain) and [len(dom.tasks(s)) for s in SPLITS] == [6, 2, 2, 2]
    chess_dom = _domain(tmp_path, "chess", "file", 12, _sizes(2, 2, 2, 6))
    assert isinstance(chess_dom, ChessDomain) and chess_dom.notes == []
