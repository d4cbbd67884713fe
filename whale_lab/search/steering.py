"""Steer notes: a reviewer's request in words that goes to the next proposer session.

A note is recorded once, as a `SteerNoted` event in the run's `events.jsonl` (so a replayed run
shows it, and a resumed one still delivers it). The next proposer session of one of the run's
harness phases takes every note not yet delivered: a proposer that reads words (`reads_steer`:
the LLM in its prompt, a human through the inbox) gets them as instructions; the rules
catalogue chooses its edits from the traces alone, so there the note is recorded as not applied.
Either way the delivery is written to the phase archive (`steer.json`, with the candidates that
session wrote and, once scored, their scores) and announced with `SteerDelivered`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.events import Emit, SteerDelivered
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.proposers.base import ProposalRequest, ProposalSession, Proposer

MAX_NOTE_CHARS = 1_000
EVENTS_FILE = "events.jsonl"


@dataclass(frozen=True)
class SteerNote:
    note_id: str
    text: str
    by: str = "user"
    ts: float = 0.0


def new_note_id() -> str:
    return "s" + uuid.uuid4().hex[:8]


def check_note(text: str) -> str:
    """The note as it will be sent; ValueError with the reason for an unusable one."""
    cleaned = " ".join(str(text).split())
    if not cleaned:
        raise ValueError("a steer note needs some words")
    if len(cleaned) > MAX_NOTE_CHARS:
        raise ValueError(
            f"a steer note is at most {MAX_NOTE_CHARS:,} characters (this one has {len(cleaned):,})"
        )
    return cleaned


def run_root_of(archive: PhaseArchive) -> Path | None:
    """The run folder of a run's harness phase archive; None for a probe's scratch archive."""
    root = archive.root.resolve()
    return root.parent.parent if root.parent.name == "harness_phases" else None


def recorded_notes(run_root: Path) -> list[SteerNote]:
    """Every steer note of the run, in the order they were written."""
    path = run_root / EVENTS_FILE
    if not path.is_file():
        return []
    out = []
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if '"steer_noted"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if isinstance(rec, dict) and rec.get("type") == "steer_noted":
                out.append(
                    SteerNote(
                        str(rec.get("note_id", "")),
                        str(rec.get("text", "")),
                        str(rec.get("by", "user")),
                        float(rec.get("ts", 0.0) or 0.0),
                    )
                )
    return out


def delivered_ids(run_root: Path) -> set[str]:
    out: set[str] = set()
    for path in (run_root / "harness_phases").glob("*/steer.json"):
        out |= set(PhaseArchive.read_steer_file(path))
    return out


def open_notes(run_root: Path) -> list[SteerNote]:
    """Notes that no proposer session has been given yet."""
    done = delivered_ids(run_root)
    return [n for n in recorded_notes(run_root) if n.note_id and n.note_id not in done]


class SteeredProposer:
    """Wraps the phase's proposer: hands it the open notes and records where they went."""

    def __init__(self, inner: Proposer, emit: Emit) -> None:
        self.inner = inner
        self.emit = emit
        self.name: str = getattr(inner, "name", type(inner).__name__)

    def __getattr__(self, item: str) -> Any:  # close(), replay details, ...
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    def propose(self, request: ProposalRequest) -> ProposalSession:
        run_root = run_root_of(request.archive)
        notes = open_notes(run_root) if run_root is not None else []
        if not notes:
            return self.inner.propose(request)
        reads = bool(getattr(self.inner, "reads_steer", False))
        texts = tuple(n.text for n in notes)
        session = self.inner.propose(dataclasses.replace(request, steer=texts))
        detail = (
            str(getattr(self.inner, "steer_route", "in its instructions"))
            if reads
            else f"not applicable: the {self.name} proposer does not read notes"
        )
        request.archive.record_steer(
            request.iteration,
            [
                {
                    "note_id": n.note_id,
                    "text": n.text,
                    "by": n.by,
                    "proposer": self.name,
                    "applied": reads,
                    "detail": detail,
                    "session_error": session.error,
                }
                for n in notes
            ],
        )
        rel = request.archive.root.resolve()
        if run_root is not None:
            rel = rel.relative_to(run_root.resolve())
        for n in notes:
            self.emit(
                SteerDelivered(
                    note_id=n.note_id,
                    cycle=request.cycle,
                    iteration=request.iteration,
                    proposer=self.name,
                    applied=reads,
                    detail=detail,
                    archive=rel.as_posix(),
                )
            )
        return session


def steered(proposer: Proposer, emit: Emit) -> Proposer:
    """The phase's proposer with steer notes delivered to it (wrapped once)."""
    if isinstance(proposer, SteeredProposer):
        return proposer
    return SteeredProposer(proposer, emit)  # type: ignore[return-value]
