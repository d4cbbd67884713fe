"""Loaders for a user's math problems, search corpus and search questions, and seeded splits."""

from __future__ import annotations

import builtins
import json
from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import ConfigError, config_from_dict
from whale_lab.domains.base import SPLITS
from whale_lab.domains.loaders import (
    DataError,
    load_corpus_file,
    load_math_file,
    load_questions_file,
    split_indices,
)
from whale_lab.domains.math import MathDomain
from whale_lab.domains.search import SearchDomain

SMALL = {"weight": 3, "harness": 2, "val": 2, "test": 2}


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# ------------------------------------------------------------------ math


def test_gsm8k_style(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "gsm.jsonl",
        [
            {
                "question": "Tom has 3 apples and buys 4. How many?",
                "answer": "3 + 4 = <<3+4=7>>7\n#### 7",
            },
            {"question": "Big?", "answer": "Many steps\n#### 1,250"},
        ],
    )
    recs = load_math_file(path)
    assert [r.answer for r in recs] == ["7", "1250"]
    assert recs[0].meta["solution"].startswith("3 + 4")
    assert recs[0].where == f"{path}:1"


def test_boxed_and_plain_answers(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "boxed.jsonl",
        [
            {"problem": "Half of one?", "solution": "It is \\boxed{\\frac{1}{2}}."},
            {"problem": "Two plus two?", "answer": "4"},
            {"question": "Root?", "answer": "so \\boxed{\\sqrt{2}}"},
            {
                "prompt": [{"role": "user", "content": "DAPO style?"}],
                "reward_model": {"ground_truth": "34"},
            },
            {"problem": "Numeric answer?", "answer": 12},
        ],
    )
    recs = load_math_file(path)
    assert [r.answer for r in recs] == ["\\frac{1}{2}", "4", "\\sqrt{2}", "34", "12"]
    assert recs[3].question == "DAPO style?"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({"answer": "#### 3"}, "no question"),
        ({"question": "Q?"}, "no answer"),
        (
            {"question": "Q?", "answer": "a long worked solution\nwith no final line at all"},
            "#### N",
        ),
        ({"question": "Q?", "solution": "no box here"}, "boxed"),
        ({"question": "Q?", "answer": "steps\n#### "}, "no number"),
        ({"question": 5, "answer": "1"}, "must be a string"),
        ({"question": "   ", "answer": "1"}, "is empty"),
    ],
)
def test_malformed_math_rows_name_file_and_line(tmp_path: Path, row: Any, message: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [{"question": "fine?", "answer": "#### 1"}, row])
    with pytest.raises(DataError, match=message) as err:
        load_math_file(path)
    assert f"{path}:2" in str(err.value)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_math_file(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="empty"):
        load_math_file(tmp_path / "empty.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_math_file(tmp_path / "data.csv")
    assert issubclass(DataError, ConfigError)


def test_json_array_file(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([{"question": "Q1?", "answer": "#### 2"}, {"question": "Q2?"}]))
    with pytest.raises(DataError, match="item 2"):
        load_math_file(path)


def test_parquet_without_pyarrow_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("pyarrow"):
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DataError, match="pip install pyarrow"):
        load_math_file(path)


def test_parquet_with_pyarrow(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "data.parquet"
    pq.write_table(
        pa.table({"problem": ["P1?", "P2?"], "solution": ["\\boxed{3}", "no box"]}), path
    )
    with pytest.raises(DataError, match="row 2"):
        load_math_file(path)
    pq.write_table(pa.table({"problem": ["P1?"], "solution": ["\\boxed{3}"]}), path)
    assert load_math_file(path)[0].answer == "3"


def test_math_domain_from_file(tmp_path: Path) -> None:
    rows = [
        {"question": f"What is {i} + {i}?", "answer": f"{i}+{i}={2 * i}\n#### {2 * i}"}
        for i in range(12)
    ]
    rows.append(rows[0])  # a duplicate question is kept once
    path = write_jsonl(tmp_path / "gsm.jsonl", rows)
    cfg = config_from_dict(
        {"run": {"seed": 3}, "domain": {"name": "math", "source": str(path), "splits": SMALL}}
    )
    dom = MathDomain.from_config(cfg)
    questions = [t.fields["question"] for s in SPLITS for t in dom.tasks(s)]
    assert len(questions) == sum(SMALL.values()) == len(set(questions))
    task = dom.tasks("test")[0]
    env = dom.make_env(task)
    assert env.step(dom.normalise_action(f"\\boxed{{{task.answer}}}")).reward == 1.0
    assert task.meta["source"].startswith(str(path))
    again = MathDomain.from_config(cfg)
    assert [t.fields for t in again.tasks("val")] == [t.fields for t in dom.tasks("val")]


def test_too_few_problems(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "few.jsonl", [{"question": f"Q{i}?", "answer": "#### 1"} for i in range(4)]
    )
    cfg = config_from_dict({"domain": {"name": "math", "source": str(path)}})
    with pytest.raises(DataError, match="4 distinct questions"):
        MathDomain.from_config(cfg)


# ------------------------------------------------------------------ search


def test_corpus_formats(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"id": "a", "title": "Brisolt", "text": "Brisolt is a town."},
            {"id": 7, "contents": '"Ostrel River"\nThe Ostrel River flows into the sea.'},
            {"id": "c", "contents": "Only one line of text."},
        ],
    )
    passages = load_corpus_file(path)
    assert passages[0] == {"id": "a", "title": "Brisolt", "text": "Brisolt is a town."}
    assert passages[1] == {
        "id": "7",
        "title": "Ostrel River",
        "text": "The Ostrel River flows into the sea.",
    }
    assert passages[2] == {"id": "c", "title": "", "text": "Only one line of text."}


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"id": "x", "title": "T"}, "needs 'text'"),
        ({"id": "a", "text": "again"}, "duplicate passage id"),
        ({"id": ["x"], "text": "t"}, "'id' must be"),
        ({"id": "y", "title": 3, "text": "t"}, "'title' must be"),
        ("oops", "not valid JSON"),
    ],
)
def test_malformed_corpus_rows(tmp_path: Path, row: Any, message: str) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "first"}, row])
    with pytest.raises(DataError, match=message) as err:
        load_corpus_file(path)
    assert f"{path}:2" in str(err.value)


def test_question_formats(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "q.jsonl",
        [
            {"question": "Who?", "answer": "Velka"},
            {"question": "Which?", "answer": ["A", "B"]},
            {"question": "When?", "golden_answers": ["1843", " "]},
            {"question": "Number?", "answer": 12},
        ],
    )
    recs = load_questions_file(path)
    assert [r.answers for r in recs] == [("Velka",), ("A", "B"), ("1843",), ("12",)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"answer": "x"}, "no 'question'"),
        ({"question": "Q?"}, "no answer"),
        ({"question": "Q?", "golden_answers": []}, "no non-empty answer"),
        ({"question": "Q?", "answer": {"a": 1}}, "string or a list"),
        ({"question": "Q?", "golden_answers": [None]}, "must hold strings"),
    ],
)
def test_malformed_question_rows(tmp_path: Path, row: Any, message: str) -> None:
    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "ok?", "answer": "y"}, row])
    with pytest.raises(DataError, match=message) as err:
        load_questions_file(path)
    assert f"{path}:2" in str(err.value)


def test_search_domain_with_user_corpus(tmp_path: Path) -> None:
    corpus = write_jsonl(
        tmp_path / "corpus.jsonl",
        [
            {"id": str(i), "title": f"Town{i}", "text": f"Town{i} lies on the River{i}."}
            for i in range(20)
        ],
    )
    questions = write_jsonl(
        tmp_path / "q.jsonl",
        [
            {"question": f"On which river does Town{i} lie?", "golden_answers": [f"River{i}"]}
            for i in range(20)
        ],
    )
    cfg = config_from_dict(
        {
            "domain": {
                "name": "search",
                "source": str(questions),
                "corpus": str(corpus),
                "splits": SMALL,
            }
        }
    )
    dom = SearchDomain.from_config(cfg)
    task = dom.tasks("test")[0]
    env = dom.make_env(task)
    out = env.step(
        dom.normalise_action(
            {
                "type": "tool",
                "name": "search",
                "arguments": {"query": task.fields["question"], "topk": 1},
            }
        )
    )
    assert task.answer[0] in out.observation["passages"][0]["text"]
    assert env.step(dom.normalise_action(task.answer[0])).reward == 1.0
    assert env.final_info()["retrieval_recall"] is True


# ------------------------------------------------------------------ splits


def test_split_indices() -> None:
    qs = [f"q{i}" for i in range(30)] + ["Q0 ", "q1"]
    sizes = {"weight": 100, "harness": 5, "val": 5, "test": 5}
    out = split_indices(qs, sizes, seed=1, label="x", source="f")
    flat = [i for s in SPLITS for i in out[s]]
    assert len(flat) == len(set(flat)) == 30  # duplicates dropped, weight takes the rest
    assert [len(out[s]) for s in ("harness", "val", "test")] == [5, 5, 5]
    assert out == split_indices(qs, sizes, seed=1, label="x", source="f")
    assert out != split_indices(qs, sizes, seed=2, label="x", source="f")
    with pytest.raises(DataError, match="f: 30 distinct"):
        split_indices(qs, {"weight": 1, "harness": 10, "val": 10, "test": 10}, 1, "x", "f")
