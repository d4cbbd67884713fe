"""Readers for a user's own math and search data, and the seeded split of any record list.

Users point `domain.source` (and, for search, `domain.corpus`) at their files. Every problem in a
file is the user's mistake to fix, so each becomes a `DataError` that names the file, the line (or
Parquet row) and what is wrong; nothing here lets a traceback reach the user. Text files may start
with a UTF-8 byte-order mark (spreadsheet exports and some editors write one).

`fit_split_sizes` is the one rule every domain (math, search, chess; built-in or a file) applies
when its data is too small for `domain.splits`: test, val and harness are never shrunk, since a
score on fewer tasks than asked is not the score asked for, so too few items for them (plus one
weight item) is a DataError naming what exists and what was asked; weight takes what is left up
to its size, and a shortfall is printed as a warning naming both numbers.
"""

from __future__ import annotations

import json
import logging
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.domains.errors import DataError
from whale_lab.domains.text import extract_boxed

SPLIT_ORDER = ("test", "val", "harness", "weight")
log = logging.getLogger("whale_lab.domains")


@dataclass(frozen=True)
class MathRecord:
    question: str
    answer: str  # the reference final answer as text ("72", "\\frac{1}{2}")
    where: str  # "file:line" or "file row N", for messages and trace metadata
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SearchRecord:
    question: str
    answers: tuple[str, ...]
    where: str
    meta: Mapping[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------ raw records


def _check_file(path: str | Path) -> Path:
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{p}: file not found")
    if not p.is_file():
        raise DataError(f"{p}: not a file")
    return p


def _iter_jsonl(p: Path) -> Iterator[tuple[str, Any]]:
    try:
        with open(p, encoding="utf-8-sig") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    yield f"{p}:{lineno}", json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{p}:{lineno}: not valid JSON ({exc.msg} at column "
                        f"{exc.colno}); each line must be one JSON object"
                    ) from None
                except RecursionError:
                    raise DataError(f"{p}:{lineno}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason}); expected JSON lines") from None


def _iter_json_array(p: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise DataError(f"{p}: JSON nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason})") from None
    if not isinstance(data, list):
        raise DataError(f"{p}: expected a JSON array of objects (or JSON lines)")
    for i, item in enumerate(data, start=1):
        yield f"{p} item {i}", item


def _iter_parquet(p: Path) -> Iterator[tuple[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(
            f"{p}: reading Parquet files needs pyarrow, which is not installed; "
            f"install it with `pip install pyarrow` or convert the file to JSONL"
        ) from None
    try:
        table = pq.read_table(p)
    except Exception as exc:  # pyarrow raises several types for unreadable files
        raise DataError(f"{p}: not a readable Parquet file ({exc})") from None
    for i, row in enumerate(table.to_pylist(), start=1):
        yield f"{p} row {i}", row


def read_records(path: str | Path) -> Iterator[tuple[str, Any]]:
    """(location, record) pairs from a .jsonl, .json (lines or array) or .parquet file."""
    p = _check_file(path)
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        yield from _iter_parquet(p)
    elif suffix in (".jsonl", ".ndjson"):
        yield from _iter_jsonl(p)
    elif suffix == ".json":
        with open(p, encoding="utf-8-sig", errors="replace") as fh:
            head = fh.read(4096).lstrip()
        yield from (_iter_json_array(p) if head.startswith("[") else _iter_jsonl(p))
    else:
        raise DataError(
            f"{p}: unsupported file type {suffix or '(none)'}; use .jsonl, .json or .parquet"
        )


def _as_object(where: str, rec: Any) -> Mapping[str, Any]:
    if not isinstance(rec, Mapping):
        raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    return rec


def _text_field(where: str, rec: Mapping[str, Any], names: Sequence[str]) -> str | None:
    for name in names:
        if name in rec and rec[name] is not None:
            value = rec[name]
            if not isinstance(value, str):
                raise DataError(
                    f"{where}: field {name!r} must be a string, got {type(value).__name__}"
                )
            if not value.strip():
                raise DataError(f"{where}: field {name!r} is empty")
            return value.strip()
    return None


# ------------------------------------------------------------------ math


def _scalar_answer(where: str, name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DataError(
            f"{where}: field {name!r} must be a string or a number, got {type(value).__name__}"
        )
    return str(value).strip()


def _math_answer(where: str, rec: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The reference answer and extra meta, from GSM8K, boxed, or DAPO-style fields."""
    meta: dict[str, Any] = {}
    rm = rec.get("reward_model")
    if isinstance(rm, Mapping) and "ground_truth" in rm:
        return _scalar_answer(where, "reward_model.ground_truth", rm["ground_truth"]), meta
    if "answer" in rec and rec["answer"] is not None:
        raw = _scalar_answer(where, "answer", rec["answer"])
        if "####" in raw:
            rationale, final = raw.rsplit("####", 1)
            final = final.strip().replace(",", "")
            if not final:
                raise DataError(f"{where}: the answer's '#### N' line has no number after ####")
            if rationale.strip():
                meta["solution"] = rationale.strip()
            return final, meta
        boxed = extract_boxed(raw)
        if boxed is not None:
            if not boxed:
                raise DataError(f"{where}: the answer's \\boxed{{}} is empty")
            meta["solution"] = raw
            return boxed, meta
        if "\n" in raw or len(raw) > 80:
            raise DataError(
                f"{where}: field 'answer' looks like a worked solution without a final "
                f"answer; end it with '#### N' or put the answer in \\boxed{{...}}"
            )
        if not raw:
            raise DataError(f"{where}: field 'answer' is empty")
        return raw, meta
    if "solution" in rec and rec["solution"] is not None:
        sol = _scalar_answer(where, "solution", rec["solution"])
        boxed = extract_boxed(sol)
        if not boxed:
            raise DataError(f"{where}: field 'solution' has no \\boxed{{...}} final answer")
        meta["solution"] = sol
        return boxed, meta
    raise DataError(
        f"{where}: no answer; expected 'answer' (GSM8K '#### N' or a final answer), "
        f"'solution' with \\boxed{{...}}, or 'reward_model.ground_truth'"
    )


def _math_question(where: str, rec: Mapping[str, Any]) -> str:
    q = _text_field(where, rec, ("question", "problem"))
    if q is not None:
        return q
    prompt = rec.get("prompt")
    if isinstance(prompt, str) and prompt.strip():
        return prompt.strip()
    if isinstance(prompt, Sequence) and not isinstance(prompt, str):
        users = [
            m.get("content") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"
        ]
        if users and isinstance(users[-1], str) and users[-1].strip():
            return users[-1].strip()
    keys = ", ".join(sorted(map(str, rec))) or "none"
    raise DataError(
        f"{where}: no question; expected a 'question' or 'problem' field (fields present: {keys})"
    )


def load_math_file(path: str | Path) -> list[MathRecord]:
    """Math problems from GSM8K-style JSONL, or JSONL/Parquet with a boxed or plain answer."""
    records: list[MathRecord] = []
    for where, raw in read_records(path):
        rec = _as_object(where, raw)
        question = _math_question(where, rec)
        answer, meta = _math_answer(where, rec)
        records.append(MathRecord(question=question, answer=answer, where=where, meta=meta))
    if not records:
        raise DataError(f"{Path(path).expanduser()}: no problems found (the file is empty)")
    return records


# ------------------------------------------------------------------ search


def split_contents(contents: str) -> tuple[str, str]:
    """Search-R1 'contents': the title on the first line (often in quotes), then the text."""
    first, _, rest = contents.partition("\n")
    title = first.strip()
    if len(title) >= 2 and title[0] == title[-1] == '"':
        title = title[1:-1]
    if not rest.strip():
        return "", contents.strip()
    return title, rest.strip()


def passage_from_record(where: str, rec: Mapping[str, Any], default_id: str) -> dict[str, str]:
    """One passage {"id","title","text"} from either corpus format."""
    pid = rec.get("id", default_id)
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: field 'id' must be a string or an integer")
    if "contents" in rec and "text" not in rec:
        contents = _text_field(where, rec, ("contents",))
        assert contents is not None
        title, text = split_contents(contents)
    else:
        text_value = _text_field(where, rec, ("text",))
        if text_value is None:
            raise DataError(f"{where}: a passage needs 'text' (with 'title') or 'contents'")
        text = text_value
        title_value = rec.get("title", "")
        if title_value is None:
            title_value = ""
        if not isinstance(title_value, str):
            raise DataError(f"{where}: field 'title' must be a string")
        title = title_value.strip()
    return {"id": str(pid), "title": title, "text": text}


def load_corpus_file(path: str | Path) -> list[dict[str, str]]:
    """Passages from JSONL `{"id","title","text"}` or Search-R1 `{"id","contents"}`."""
    passages: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for i, (where, raw) in enumerate(read_records(path)):
        p = passage_from_record(where, _as_object(where, raw), default_id=str(i))
        if p["id"] in seen:
            raise DataError(f"{where}: duplicate passage id {p['id']!r} (first at {seen[p['id']]})")
        seen[p["id"]] = where
        passages.append(p)
    if not passages:
        raise DataError(f"{Path(path).expanduser()}: no passages found (the file is empty)")
    return passages


def _answers(where: str, rec: Mapping[str, Any]) -> tuple[str, ...]:
    for name in ("golden_answers", "answers", "answer"):
        if name not in rec or rec[name] is None:
            continue
        value = rec[name]
        items = [value] if isinstance(value, (str, int, float)) else value
        if isinstance(items, bool) or not isinstance(items, Sequence) or isinstance(items, str):
            raise DataError(f"{where}: field {name!r} must be a string or a list of strings")
        out = []
        for item in items:
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise DataError(
                    f"{where}: field {name!r} must hold strings, got {type(item).__name__}"
                )
            if str(item).strip():
                out.append(str(item).strip())
        if not out:
            raise DataError(f"{where}: field {name!r} has no non-empty answer")
        return tuple(out)
    raise DataError(
        f"{where}: no answer; expected 'answer' (a string or list) or 'golden_answers' (a list)"
    )


def load_questions_file(path: str | Path) -> list[SearchRecord]:
    """Questions with `question` plus `answer` or `golden_answers` (JSONL, JSON or Parquet)."""
    out: list[SearchRecord] = []
    for where, raw in read_records(path):
        rec = _as_object(where, raw)
        question = _text_field(where, rec, ("question",))
        if question is None:
            raise DataError(f"{where}: no 'question' field")
        out.append(SearchRecord(question=question, answers=_answers(where, rec), where=where))
    if not out:
        raise DataError(f"{Path(path).expanduser()}: no questions found (the file is empty)")
    return out


# ------------------------------------------------------------------ splits


def _key(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def fit_split_sizes(
    available: int, sizes: Mapping[str, int], have: str, label: str
) -> tuple[dict[str, int], str]:
    """Split sizes that `available` items can fill, by the one rule for too-small data (see the
    module docstring); returns the sizes and the warning printed (empty when nothing shrank).

    `have` says what exists, e.g. "data.jsonl: 40 distinct questions"; `label` is the domain.
    """
    asked = {s: int(sizes[s]) for s in SPLIT_ORDER}
    need = sum(asked[s] for s in SPLIT_ORDER if s != "weight")
    listed = ", ".join(f"{s}={asked[s]}" for s in SPLIT_ORDER)
    if available < need + min(1, asked["weight"]):
        raise DataError(
            f"{have}, but test, val and harness need {need} and weight at least 1 "
            f"(domain.splits: {listed}); lower domain.splits sizes or add data"
        )
    out = dict(asked)
    out["weight"] = min(asked["weight"], available - need)
    if out["weight"] == asked["weight"]:
        return out, ""
    note = (
        f"{have}: after test, val and harness ({need}) only {out['weight']} are left for weight, "
        f"which asks for {asked['weight']}; training uses {out['weight']} (set "
        f"domain.splits.weight = {out['weight']} to silence this)"
    )
    log.warning("%s: warning: %s", label, note)
    return out, note


def split_indices(
    questions: Sequence[str], sizes: Mapping[str, int], seed: int, label: str, source: str
) -> dict[str, list[int]]:
    """Seeded disjoint splits of a user's records (duplicate question texts kept once), sized by
    `fit_split_sizes`: test, val and harness in full, weight up to its size from what is left."""
    first: dict[str, int] = {}
    for i, q in enumerate(questions):
        first.setdefault(_key(q), i)
    unique = sorted(first.values())
    random.Random(f"whale-split:{label}:{seed}").shuffle(unique)
    fitted, _note = fit_split_sizes(
        len(unique), sizes, f"{source}: {len(unique)} distinct questions", label
    )
    out: dict[str, list[int]] = {}
    pos = 0
    for split in SPLIT_ORDER:
        out[split] = unique[pos : pos + fitted[split]]
        pos += fitted[split]
    return out
