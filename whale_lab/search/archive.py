"""The phase archive: the proposer's whole view of a harness phase, kept on disk.

One folder per phase, one folder per candidate. Every proposer (rules, an LLM, a human, the `claude`
CLI) reads the same files: code, diff against the parent, hypothesis, validation and smoke results,
scores, raw traces of the `harness` split, status and the human decision. The test split, the verifier
and the reference answers are never written here. Every file write is atomic (`whale_lab.store`).
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.harness.ast_check import MAX_SOURCE_CHARS
from whale_lab.paired import MIN_TASKS, paired_difference, scores_by_task
from whale_lab.store import atomic_write_json, atomic_write_text, read_json, read_jsonl
from whale_lab.trace import scrub_trace

# The largest harness file the archive takes: the static check's limit, enforced when written so
# that an oversized proposal never reaches disk (and the proposer hears why at once).
MAX_CANDIDATE_CHARS = MAX_SOURCE_CHARS
TRANSCRIPT_FILE = "proposer_transcript.json"

STATUSES = (
    "proposed",
    "invalid",
    "awaiting_review",
    "rejected",
    "approved",
    "evaluated",
    "crashed",
    "accepted",
)
# A candidate in one of these needs no more work in its iteration.
TERMINAL_STATUSES = frozenset({"invalid", "rejected", "evaluated", "crashed", "accepted"})
# Candidates whose scores count for acceptance.
SCORED_STATUSES = frozenset({"evaluated", "accepted"})

SURFACES = ("prompts", "tool_io", "parser", "feedback", "context", "termination")

_ID_RE = re.compile(r"^c(\d{3,})$")

ARCHIVE_README = """\
# Harness phase archive

One folder per candidate under `candidates/<id>/`:

| file | what it holds |
|---|---|
| `harness.py` | the candidate harness (the whole file) |
| `meta.json` | id, parent_id, iteration, surface, mechanism, proposer, cited traces |
| `diff.patch` | unified diff against the parent's `harness.py` |
| `hypothesis.md` | why this change should help, citing evidence |
| `validation.json` | contract / sandbox / prompt-only check: ok and reason |
| `smoke.json` | smoke run on a few `harness` tasks: success rate, failures |
| `scores.json` | score on the `harness` split: success_rate, mean_turns, tokens, failures, diagnostics (none computed from the reference answers) |
| `smoke_traces.jsonl` | the smoke run's episodes |
| `traces.jsonl` | one episode per line: every prompt, raw model output, parsed action, observation, feedback, stop reason |
| `status.json` | proposed, invalid, awaiting_review, rejected, approved, evaluated, crashed or accepted |
| `decision.json` | the review decision and its reason (rejection reasons are meant to be read) |
| `proposer_transcript.json` | the proposer session that wrote it: requests, replies, tool calls and results (each cut to a cap) |

`summary.md` / `summary.json` list every candidate in one row; `frontier.json` holds success rate vs
tokens per rollout and the Pareto-optimal candidates. Trace ids are written `<candidate>/<task>#<sample>`.
`proposer_sessions/iteration-NNN.json` holds each proposer session's transcript, candidates or not.
`steer.json` holds the reviewers' steer notes each session was given, whether the proposer could
follow them, and the candidates that session wrote with their status and score.
"""


def unified_diff(parent_code: str, code: str, parent_id: str, candidate_id: str) -> str:
    """A `difflib` unified diff of two harness files, as the reviewer and proposers see it."""
    lines = difflib.unified_diff(
        parent_code.splitlines(keepends=True),
        code.splitlines(keepends=True),
        fromfile=f"{parent_id or 'none'}/harness.py",
        tofile=f"{candidate_id}/harness.py",
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def trace_id(candidate_id: str, record: dict[str, Any]) -> str:
    return f"{candidate_id}/{record.get('task_id', '?')}#{record.get('sample', 0)}"


INCOMING = "incoming"  # the proposer name of the harness a phase starts from


@dataclass
class CandidateRecord:
    """One candidate as read from disk (a snapshot; the files stay the truth)."""

    id: str
    parent_id: str
    iteration: int
    surface: str
    proposer: str
    mechanism: str
    hypothesis: str
    status: str
    status_reason: str
    folder: Path
    cited_traces: tuple[str, ...] = ()
    scores: dict[str, Any] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)
    decision: dict[str, Any] = field(default_factory=dict)

    @property
    def harness_path(self) -> Path:
        return self.folder / "harness.py"

    @property
    def success_rate(self) -> float | None:
        v = self.scores.get("success_rate")
        return float(v) if isinstance(v, (int, float)) else None

    @property
    def mean_turns(self) -> float | None:
        v = self.scores.get("mean_turns")
        return float(v) if isinstance(v, (int, float)) else None


class ArchiveError(ValueError):
    """A request the archive cannot honour (unknown candidate, bad status, ...)."""


class PhaseArchive:
    """The folder of one harness phase: `candidates/`, summary, frontier, state, inbox."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.candidates_dir.mkdir(parents=True, exist_ok=True)
        readme = self.root / "README.md"
        if not readme.exists():
            atomic_write_text(readme, ARCHIVE_README)

    # ------------------------------------------------------------------ layout
    @property
    def candidates_dir(self) -> Path:
        return self.root / "candidates"

    @property
    def inbox(self) -> Path:
        return self.root / "inbox"

    @property
    def sessions_dir(self) -> Path:
        return self.root / "proposer_sessions"

    def session_path(self, iteration: int) -> Path:
        return self.sessions_dir / f"iteration-{int(iteration):03d}.json"

    def folder(self, cid: str) -> Path:
        if not _ID_RE.match(cid):
            raise ArchiveError(f"{cid!r} is not a candidate id (expected c000, c001, ...)")
        return self.candidates_dir / cid

    def exists(self, cid: str) -> bool:
        return bool(_ID_RE.match(cid)) and (self.candidates_dir / cid / "meta.json").exists()

    def ids(self) -> list[str]:
        out = [p.name for p in self.candidates_dir.iterdir() if _ID_RE.match(p.name)]
        return sorted(
            (c for c in out if (self.candidates_dir / c / "meta.json").exists()),
            key=lambda c: int(c[1:]),
        )

    def next_id(self) -> str:
        nums = [int(p.name[1:]) for p in self.candidates_dir.iterdir() if _ID_RE.match(p.name)]
        return f"c{(max(nums) + 1) if nums else 0:03d}"

    # ------------------------------------------------------------------ writing
    def add_candidate(
        self,
        code: str,
        *,
        parent_id: str,
        hypothesis: str,
        surface: str,
        proposer: str,
        iteration: int,
        mechanism: str = "",
        cited_traces: Iterable[str] = (),
        extra: dict[str, Any] | None = None,
    ) -> str:
        """Write a new candidate folder (status `proposed`) and return its id."""
        if parent_id and not self.exists(parent_id):
            raise ArchiveError(f"parent {parent_id!r} is not in the archive")
        if not code.strip():
            raise ArchiveError("candidate code is empty")
        if len(code) > MAX_CANDIDATE_CHARS:
            raise ArchiveError(
                f"candidate code is too large ({len(code):,} characters; at most "
                f"{MAX_CANDIDATE_CHARS:,})"
            )
        cid = self.next_id()
        folder = self.folder(cid)
        folder.mkdir(parents=True, exist_ok=False)
        parent_code = self.code(parent_id) if parent_id else ""
        if not code.endswith("\n"):
            code += "\n"
        atomic_write_text(folder / "harness.py", code)
        atomic_write_text(folder / "diff.patch", unified_diff(parent_code, code, parent_id, cid))
        atomic_write_text(folder / "hypothesis.md", hypothesis.strip() + "\n")
        self._attach_transcript(folder, code, iteration)
        self.set_status(cid, "proposed")
        # meta.json last: its presence marks a complete candidate folder.
        atomic_write_json(
            folder / "meta.json",
            {
                "id": cid,
                "parent_id": parent_id,
                "iteration": int(iteration),
                "surface": surface,
                "mechanism": mechanism,
                "proposer": proposer,
                "cited_traces": list(cited_traces),
                "created": time.time(),
                **(extra or {}),
            },
        )
        return cid

    @property
    def steer_path(self) -> Path:
        return self.root / "steer.json"

    def record_steer(self, iteration: int, notes: list[dict[str, Any]]) -> None:
        """Keep the steer notes one proposer session was given (keyed by note id)."""
        data = read_json(self.steer_path, {}) or {}
        kept = data.get("notes") if isinstance(data.get("notes"), dict) else {}
        for note in notes:
            kept[str(note["note_id"])] = {**note, "iteration": int(iteration), "ts": time.time()}
        atomic_write_json(self.steer_path, {"notes": kept})
        self._refresh_steer()

    @staticmethod
    def read_steer_file(path: Path) -> dict[str, dict[str, Any]]:
        data = read_json(path, {}) or {}
        notes = data.get("notes") if isinstance(data, dict) else None
        return {str(k): v for k, v in notes.items() if isinstance(v, dict)} if notes else {}

    def steer_notes(self) -> list[dict[str, Any]]:
        """Each delivered note with its outcome: the candidates its session wrote, their scores."""
        notes = self.read_steer_file(self.steer_path)
        by_iteration: dict[int, list[dict[str, Any]]] = {}
        for r in self.records():
            if r.proposer != INCOMING:
                by_iteration.setdefault(r.iteration, []).append(
                    {"id": r.id, "status": r.status, "success_rate": r.success_rate}
                )
        return [
            {**n, "candidates": by_iteration.get(int(n.get("iteration", 0)), [])}
            for n in sorted(notes.values(), key=lambda n: (n.get("iteration", 0), n.get("ts", 0)))
        ]

    def _refresh_steer(self) -> None:
        if self.steer_path.exists():
            notes = {n["note_id"]: n for n in self.steer_notes()}
            atomic_write_json(self.steer_path, {"notes": notes})

    def write_session(self, iteration: int, transcript: dict[str, Any]) -> Path:
        """Keep one proposer session's transcript; candidates added later for the iteration get it."""
        path = self.session_path(iteration)
        atomic_write_json(path, transcript)
        return path

    def _attach_transcript(self, folder: Path, code: str, iteration: int) -> None:
        """Copy the iteration's session transcript into the candidate folder, if it wrote this code.

        The code is the link: a transcript from another session (an earlier, interrupted try at
        the same iteration) names other code and is not attached.
        """
        data = read_json(self.session_path(iteration), None)
        if not isinstance(data, dict):
            return
        cands = data.get("candidates")
        if not isinstance(cands, list):
            return
        index = next(
            (
                i
                for i, c in enumerate(cands)
                if isinstance(c, dict) and str(c.get("code", "")).strip() == code.strip()
            ),
            None,
        )
        if index is not None:
            atomic_write_json(folder / TRANSCRIPT_FILE, {**data, "candidate_index": index})

    def replace_code(self, cid: str, code: str) -> None:
        """A human's edit: keep the proposed file as `harness.proposed.py`, recompute the diff."""
        folder = self.folder(cid)
        original = folder / "harness.proposed.py"
        if not original.exists():
            atomic_write_text(original, self.code(cid))
        if not code.endswith("\n"):
            code += "\n"
        atomic_write_text(folder / "harness.py", code)
        parent_id = self.meta(cid).get("parent_id", "")
        parent_code = self.code(parent_id) if parent_id else ""
        atomic_write_text(folder / "diff.patch", unified_diff(parent_code, code, parent_id, cid))

    def set_status(self, cid: str, status: str, reason: str = "") -> None:
        if status not in STATUSES:
            raise ArchiveError(f"unknown status {status!r}; expected one of {', '.join(STATUSES)}")
        path = self.folder(cid) / "status.json"
        old = read_json(path, {}) or {}
        history = list(old.get("history", []))
        history.append({"status": status, "reason": reason, "ts": time.time()})
        atomic_write_json(path, {"status": status, "reason": reason, "history": history})

    def write_json(self, cid: str, name: str, data: Any) -> None:
        if name not in {
            "validation",
            "smoke",
            "scores",
            "decision",
            "paired_vs_incoming",
            "noise_floor",
        }:
            raise ArchiveError(f"unknown candidate file {name!r}")
        atomic_write_json(self.folder(cid) / f"{name}.json", data)

    def write_traces(self, cid: str, traces: Iterable[dict[str, Any]], name: str = "traces") -> int:
        """Write the episodes of one scoring or smoke run (scrubbed); returns how many."""
        if name not in ("traces", "smoke_traces"):
            raise ArchiveError(f"unknown trace file {name!r}")
        lines = [json.dumps(scrub_trace(t), ensure_ascii=False, default=str) for t in traces]
        atomic_write_text(self.folder(cid) / f"{name}.jsonl", "".join(x + "\n" for x in lines))
        return len(lines)

    # ------------------------------------------------------------------ reading
    def code(self, cid: str) -> str:
        try:
            return (self.folder(cid) / "harness.py").read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ArchiveError(f"candidate {cid!r} has no harness.py") from None

    def meta(self, cid: str) -> dict[str, Any]:
        return read_json(self.folder(cid) / "meta.json", {}) or {}

    def status(self, cid: str) -> str:
        return str((read_json(self.folder(cid) / "status.json", {}) or {}).get("status", ""))

    def read(self, cid: str, name: str) -> dict[str, Any]:
        return read_json(self.folder(cid) / f"{name}.json", {}) or {}

    def diff(self, cid: str) -> str:
        p = self.folder(cid) / "diff.patch"
        return p.read_text(encoding="utf-8") if p.exists() else ""

    def hypothesis(self, cid: str) -> str:
        p = self.folder(cid) / "hypothesis.md"
        return p.read_text(encoding="utf-8").strip() if p.exists() else ""

    def traces(self, cid: str) -> Iterator[dict[str, Any]]:
        yield from read_jsonl(self.folder(cid) / "traces.jsonl")

    def record(self, cid: str) -> CandidateRecord:
        meta = self.meta(cid)
        st = read_json(self.folder(cid) / "status.json", {}) or {}
        return CandidateRecord(
            id=cid,
            parent_id=str(meta.get("parent_id", "")),
            iteration=int(meta.get("iteration", 0)),
            surface=str(meta.get("surface", "")),
            proposer=str(meta.get("proposer", "")),
            mechanism=str(meta.get("mechanism", "")),
            hypothesis=self.hypothesis(cid),
            status=str(st.get("status", "")),
            status_reason=str(st.get("reason", "")),
            folder=self.folder(cid),
            cited_traces=tuple(meta.get("cited_traces", ())),
            scores=self.read(cid, "scores"),
            smoke=self.read(cid, "smoke"),
            validation=self.read(cid, "validation"),
            decision=self.read(cid, "decision"),
        )

    def records(self) -> list[CandidateRecord]:
        return [self.record(c) for c in self.ids()]

    def lineage(self, cid: str) -> list[str]:
        """The candidate and its ancestors, newest first."""
        out: list[str] = []
        cur = cid
        while cur and cur not in out and self.exists(cur):
            out.append(cur)
            cur = str(self.meta(cur).get("parent_id", ""))
        return out

    # ------------------------------------------------------------------ acceptance
    def best(self, min_gain: float = 0.0, acceptance: str = "best") -> str | None:
        """Best success rate among scored candidates; ties go to fewer mean turns, then the older.

        With `min_gain` > 0 a new candidate must beat the incoming harness by at least that much
        (a fraction of tasks), or the incoming harness stays: on a small harness split a one-task
        win is often noise. With `acceptance="paired"` the best candidate is compared with the
        incoming harness task by task (same tasks, same seeds) and kept only when the lower bound
        of the paired interval is above `min_gain`; the comparison is written beside it
        (`paired_vs_incoming.json`).
        """
        scored = [
            r for r in self.records() if r.status in SCORED_STATUSES and r.success_rate is not None
        ]
        if not scored:
            return None
        scored.sort(key=lambda r: (-(r.success_rate or 0.0), r.mean_turns or 0.0, int(r.id[1:])))
        best = scored[0]
        incoming_rec = next((r for r in scored if r.proposer == INCOMING), None)
        if acceptance == "paired" and incoming_rec is not None and best.id != incoming_rec.id:
            result = paired_difference(
                scores_by_task(self.traces(incoming_rec.id)),
                scores_by_task(self.traces(best.id)),
            )
            record = {**result.to_dict(), "incoming": incoming_rec.id, "min_gain": min_gain}
            supported = result.n_tasks >= MIN_TASKS and result.low > min_gain
            record["accepted"] = supported
            self.write_json(best.id, "paired_vs_incoming", record)
            return best.id if supported else incoming_rec.id
        if min_gain > 0:
            incoming = next((r for r in scored if r.proposer == INCOMING), None)
            if (
                incoming is not None
                and best.id != incoming.id
                and (best.success_rate or 0.0) < (incoming.success_rate or 0.0) + min_gain - 1e-9
            ):
                return incoming.id
        return best.id

    def pinned(self) -> str | None:
        pin = read_json(self.root / "pin.json", {}) or {}
        cid = pin.get("candidate_id")
        return str(cid) if cid and self.exists(str(cid)) else None

    def pin(self, cid: str, by: str = "human", reason: str = "") -> None:
        if not self.exists(cid):
            raise ArchiveError(f"cannot pin {cid!r}: no such candidate")
        atomic_write_json(
            self.root / "pin.json",
            {"candidate_id": cid, "by": by, "reason": reason, "ts": time.time()},
        )

    # ------------------------------------------------------------------ summary
    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for r in self.records():
            rollouts = int(r.scores.get("rollouts", 0) or 0)
            tokens = int(r.scores.get("tokens", 0) or 0)
            rows.append(
                {
                    "id": r.id,
                    "iteration": r.iteration,
                    "parent_id": r.parent_id,
                    "surface": r.surface,
                    "mechanism": r.mechanism,
                    "proposer": r.proposer,
                    "status": r.status,
                    "status_reason": r.status_reason,
                    "valid": r.validation.get("ok"),
                    "smoke_success": r.smoke.get("success_rate"),
                    "success_rate": r.success_rate,
                    "mean_turns": r.mean_turns,
                    "tokens": tokens,
                    "tokens_per_rollout": (tokens / rollouts) if rollouts else None,
                    "rollouts": rollouts,
                    "failures": r.scores.get("failures", {}),
                    "decision": r.decision.get("decision", ""),
                    "decision_reason": r.decision.get("reason", ""),
                    "hypothesis": r.hypothesis.splitlines()[0] if r.hypothesis else "",
                }
            )
        return rows

    def frontier(self) -> dict[str, Any]:
        pts = [
            {
                "id": r["id"],
                "success_rate": r["success_rate"],
                "tokens_per_rollout": r["tokens_per_rollout"],
                "mean_turns": r["mean_turns"],
            }
            for r in self.rows()
            if r["status"] in SCORED_STATUSES
            and r["success_rate"] is not None
            and r["tokens_per_rollout"] is not None
        ]
        pareto = []
        for p in pts:
            dominated = any(
                q["success_rate"] >= p["success_rate"]
                and q["tokens_per_rollout"] <= p["tokens_per_rollout"]
                and (
                    q["success_rate"] > p["success_rate"]
                    or q["tokens_per_rollout"] < p["tokens_per_rollout"]
                )
                for q in pts
            )
            if not dominated:
                pareto.append(p["id"])
        pts.sort(key=lambda p: p["tokens_per_rollout"])
        return {"points": pts, "pareto": pareto, "best": self.best(), "pinned": self.pinned()}

    def write_summary(self) -> None:
        self._refresh_steer()
        rows = self.rows()
        atomic_write_json(self.root / "summary.json", {"candidates": rows, "best": self.best()})
        atomic_write_json(self.root / "frontier.json", self.frontier())
        atomic_write_text(self.root / "summary.md", _summary_markdown(rows, self.best()))


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, float):
        return f"{100 * v:.1f}%" if pct else f"{v:.2f}"
    return str(v)


def _cell(text: str, width: int = 90) -> str:
    text = " ".join(str(text).split()).replace("|", "\\|")
    return text if len(text) <= width else text[: width - 1] + "…"


def _summary_markdown(rows: list[dict[str, Any]], best: str | None) -> str:
    head = (
        "| id | iter | parent | surface | mechanism | status | smoke | success | turns | "
        "tokens/rollout | failures | decision | hypothesis |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    body = []
    for r in rows:
        failures = ", ".join(f"{k}={v}" for k, v in sorted((r["failures"] or {}).items()) if v)
        decision = r["decision"] + (f": {r['decision_reason']}" if r["decision_reason"] else "")
        if r["status"] in ("invalid", "crashed") and r["status_reason"]:
            decision = decision or r["status_reason"]
        body.append(
            f"| {r['id']} | {r['iteration']} | {r['parent_id'] or '-'} | {r['surface'] or '-'} | "
            f"{r['mechanism'] or '-'} | {r['status']} | {_fmt(r['smoke_success'], True)} | "
            f"{_fmt(r['success_rate'], True)} | {_fmt(r['mean_turns'])} | "
            f"{_fmt(r['tokens_per_rollout'])} | {_cell(failures, 60) or '-'} | "
            f"{_cell(decision, 60) or '-'} | {_cell(r['hypothesis'])} |"
        )
    tail = f"\nBest so far: {best}\n" if best else "\nNo candidate scored yet.\n"
    return "# Candidates\n\n" + head + "\n".join(body) + "\n" + tail
