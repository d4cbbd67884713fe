"""The review pack: what a reviewer weighs beside the diff, read from the phase archive on disk.

For the candidate under review: the tasks it fixes and breaks against the incoming harness
(paired on the same task ids, from its scored traces or, before scoring, its smoke run), the
noise floor of the split, the smoke result, the files its proposer session read and that
session's transcript. The archive is the truth, so a live run and a reopened one show the same
pack. Nothing here imports textual.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_lab.paired import paired_difference, scores_by_task
from whale_lab.search.archive import INCOMING, TRANSCRIPT_FILE
from whale_lab.search.proposers.transcript import load_transcript
from whale_lab.store import read_json, read_jsonl
from whale_lab.trace import EpisodeTrace

#: Archive tools whose arguments name what the proposer looked at.
READING_TOOLS = ("read_file", "list_files", "grep")


@dataclass(frozen=True)
class PairedTask:
    """One task both harnesses ran: mean reward of each, and which way it moved."""

    task_id: str
    incoming: float
    candidate: float

    @property
    def change(self) -> str:
        if self.candidate > self.incoming + 1e-9:
            return "fixes"
        if self.candidate < self.incoming - 1e-9:
            return "breaks"
        return "same"


@dataclass(frozen=True)
class FileRead:
    """A file (or folder, or grep) the proposer session asked for, with how often."""

    tool: str
    target: str
    times: int


@dataclass(frozen=True)
class ReviewPack:
    candidate_id: str
    folder: Path | None = None
    incoming_id: str = ""
    # "scored" (the candidate's traces.jsonl) or "smoke" (smoke_traces.jsonl) or "" (neither)
    source: str = ""
    pairs: tuple[PairedTask, ...] = ()
    paired: dict[str, Any] = field(default_factory=dict)  # paired_difference(...).to_dict()
    noise_floor: dict[str, Any] = field(default_factory=dict)
    smoke: dict[str, Any] = field(default_factory=dict)
    files_read: tuple[FileRead, ...] = ()
    transcript: dict[str, Any] | None = None
    transcript_path: Path | None = None
    problem: str = ""  # why the pack is thin (no archive found, ...), shown as is

    @property
    def fixes(self) -> list[PairedTask]:
        return [p for p in self.pairs if p.change == "fixes"]

    @property
    def breaks(self) -> list[PairedTask]:
        return [p for p in self.pairs if p.change == "breaks"]

    @property
    def changed(self) -> list[PairedTask]:
        """Fixed tasks first, then broken ones: what the pair table lists."""
        return self.fixes + self.breaks


def find_candidate_folder(run_root: Path, candidate_id: str, diff: str = "") -> Path | None:
    """The candidate's folder among the run's harness phases.

    Candidate ids restart in every phase, so the diff recorded with the review request picks the
    folder; without one (or no match) the newest phase holding the id is taken.
    """
    phases = run_root / "harness_phases"
    if not phases.is_dir():
        return None
    found = [
        p / "candidates" / candidate_id
        for p in phases.iterdir()
        if (p / "candidates" / candidate_id / "meta.json").is_file()
    ]
    if not found:
        return None
    if diff.strip():
        for folder in found:
            patch = folder / "diff.patch"
            if patch.is_file() and patch.read_text(encoding="utf-8").strip() == diff.strip():
                return folder
    return max(found, key=lambda p: (p / "meta.json").stat().st_mtime)


def _incoming_id(candidates_dir: Path) -> str:
    for meta_path in sorted(candidates_dir.glob("c*/meta.json")):
        meta = read_json(meta_path, {}) or {}
        if meta.get("proposer") == INCOMING:
            return str(meta.get("id", meta_path.parent.name))
    return ""


def _mean(values: list[float | None]) -> float | None:
    valid = [v for v in values if v is not None]
    return sum(valid) / len(valid) if valid else None


def pair_tasks(
    incoming: dict[str, list[float | None]], candidate: dict[str, list[float | None]]
) -> tuple[PairedTask, ...]:
    """Tasks both ran with at least one valid episode each, in the candidate's order."""
    out = []
    for task, rewards in candidate.items():
        mine, theirs = _mean(rewards), _mean(incoming.get(task, []))
        if mine is not None and theirs is not None:
            out.append(PairedTask(task, theirs, mine))
    return tuple(out)


def files_read(transcript: dict[str, Any] | None) -> tuple[FileRead, ...]:
    """What the session's archive tools were asked for, in first-asked order."""
    if not transcript:
        return ()
    counts: dict[tuple[str, str], int] = {}
    for entry in transcript.get("entries") or []:
        if not isinstance(entry, dict) or entry.get("kind") != "tool":
            continue
        name = str(entry.get("name", ""))
        if name not in READING_TOOLS:
            continue
        try:
            args = json.loads(entry.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = {}
        args = args if isinstance(args, dict) else {}
        target = str(args.get("path", "."))
        if name == "grep":
            target = f"{args.get('pattern', '')!s} in {target}"
        counts[(name, target)] = counts.get((name, target), 0) + 1
    return tuple(FileRead(tool, target, n) for (tool, target), n in counts.items())


def build_pack(run_root: Path | None, candidate_id: str, diff: str = "") -> ReviewPack:
    """Everything the archive knows about one candidate, for the review tab."""
    if run_root is None:
        return ReviewPack(candidate_id, problem="no run folder: nothing recorded to compare")
    folder = find_candidate_folder(run_root, candidate_id, diff)
    if folder is None:
        return ReviewPack(
            candidate_id,
            problem=f"{candidate_id}: no archive folder in this run's harness_phases/ to read",
        )
    candidates_dir = folder.parent
    incoming = _incoming_id(candidates_dir)
    source, mine = "", {}
    for name, label in (("traces.jsonl", "scored"), ("smoke_traces.jsonl", "smoke")):
        path = folder / name
        if path.is_file():
            mine = scores_by_task(read_jsonl(path))
            if mine:
                source = label
                break
    pairs: tuple[PairedTask, ...] = ()
    paired: dict[str, Any] = {}
    if incoming and incoming != candidate_id and source:
        theirs = scores_by_task(read_jsonl(candidates_dir / incoming / "traces.jsonl"))
        pairs = pair_tasks(theirs, mine)
        if pairs:
            paired = paired_difference(
                theirs, {p.task_id: mine[p.task_id] for p in pairs}
            ).to_dict()
    noise = read_json(candidates_dir / incoming / "noise_floor.json", {}) if incoming else {}
    path = folder / TRANSCRIPT_FILE
    transcript = load_transcript(path) if path.is_file() else None
    return ReviewPack(
        candidate_id=candidate_id,
        folder=folder,
        incoming_id=incoming,
        source=source,
        pairs=pairs,
        paired=paired,
        noise_floor=noise or {},
        smoke=read_json(folder / "smoke.json", {}) or {},
        files_read=files_read(transcript),
        transcript=transcript,
        transcript_path=path if transcript else None,
    )


def paired_traces(
    pack: ReviewPack, task_id: str
) -> tuple[EpisodeTrace | None, EpisodeTrace | None]:
    """The first recorded episode of `task_id` under the incoming harness and the candidate."""
    if pack.folder is None:
        return None, None
    mine_file = "traces.jsonl" if pack.source == "scored" else "smoke_traces.jsonl"
    return (
        _first_trace(pack.folder.parent / pack.incoming_id / "traces.jsonl", task_id),
        _first_trace(pack.folder / mine_file, task_id),
    )


def _first_trace(path: Path, task_id: str) -> EpisodeTrace | None:
    if not path.is_file():
        return None
    for rec in read_jsonl(path):
        if isinstance(rec, dict) and str(rec.get("task_id", "")) == task_id:
            try:
                return EpisodeTrace.from_dict(rec)
            except TypeError:
                return None
    return None


class PackCache:
    """Packs by candidate, rebuilt only when a file they are read from changes (scoring adds
    traces after the review), so redrawing the review tab costs a few `stat` calls."""

    def __init__(self) -> None:
        self._packs: dict[tuple[str, str], tuple[tuple[float, ...], ReviewPack]] = {}

    def get(self, run_root: Path | None, candidate_id: str, diff: str = "") -> ReviewPack:
        key = (candidate_id, diff)
        known = self._packs.get(key)
        stamp = _stamp(run_root, known[1] if known else None)
        if known is not None and known[0] == stamp and known[1].folder is not None:
            return known[1]
        pack = build_pack(run_root, candidate_id, diff)
        self._packs[key] = (_stamp(run_root, pack), pack)
        return pack


def _stamp(run_root: Path | None, pack: ReviewPack | None) -> tuple[float, ...]:
    if run_root is None or pack is None or pack.folder is None:
        return ()
    folder, incoming = pack.folder, pack.folder.parent / pack.incoming_id
    paths = (
        folder / "traces.jsonl",
        folder / "smoke_traces.jsonl",
        folder / "smoke.json",
        folder / TRANSCRIPT_FILE,
        incoming / "traces.jsonl",
        incoming / "noise_floor.json",
    )
    return tuple(p.stat().st_mtime_ns if p.exists() else -1.0 for p in paths)
