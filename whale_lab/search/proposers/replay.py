"""Replay recorded proposer sessions: the same candidates again, with no request to any endpoint.

`proposer.replay` (or `whale-lab search --replay-proposer PATH`) names a phase archive, a run
folder (every `harness_phases/cycle-*/` in it) or one transcript file. Sessions are taken in order
of (cycle, iteration); a request gets the recorded session of its own cycle and iteration when
there is one, else the next one not yet replayed. A recorded parent that is not in the new archive
becomes the request's default parent. Each replayed session is recorded again (with
`replayed_from`), so its candidates carry a transcript like any other.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from whale_lab.config import ConfigError
from whale_lab.search.archive import TRANSCRIPT_FILE
from whale_lab.search.proposers.base import ProposalRequest, ProposalSession, ProposerUsageRecord
from whale_lab.search.proposers.transcript import candidate_from_record, load_transcript


def _archives(root: Path) -> list[Path]:
    if (root / "proposer_sessions").is_dir() or (root / "candidates").is_dir():
        return [root]
    return sorted(p for p in (root / "harness_phases").glob("cycle-*") if p.is_dir())


def recorded_sessions(path: str | Path) -> list[dict[str, Any]]:
    """Every transcript under `path`, ordered by (cycle, iteration, start time)."""
    root = Path(path)
    found: list[dict[str, Any]] = []
    if root.is_file():
        data = load_transcript(root)
        found = [data] if data else []
    for archive in _archives(root) if root.is_dir() else []:
        sessions = [load_transcript(p) for p in sorted(archive.glob("proposer_sessions/*.json"))]
        kept = [s for s in sessions if s]
        if not kept:  # only the candidates' copies are left: one per session
            seen: set[str] = set()
            for p in sorted(archive.glob(f"candidates/*/{TRANSCRIPT_FILE}")):
                s = load_transcript(p)
                if s and str(s.get("session_id")) not in seen:
                    seen.add(str(s.get("session_id")))
                    kept.append(s)
        found.extend(kept)
    return sorted(
        found,
        key=lambda s: (int(s.get("cycle") or 0), int(s.get("iteration") or 0), s.get("started", 0)),
    )


class ReplayProposer:
    """Returns the recorded candidates of each session in order; sends nothing anywhere."""

    name = "replay"

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise ConfigError(f"proposer.replay: {self.path} does not exist")
        self.sessions = recorded_sessions(self.path)
        if not self.sessions:
            raise ConfigError(
                f"proposer.replay: no recorded proposer session under {self.path} (expected a "
                "phase archive, a run folder or a proposer_transcript.json)"
            )
        self._used: set[int] = set()

    def _pick(self, request: ProposalRequest) -> int | None:
        free = [i for i in range(len(self.sessions)) if i not in self._used]
        for i in free:
            s = self.sessions[i]
            if (int(s.get("cycle") or 0), int(s.get("iteration") or 0)) == (
                request.cycle,
                request.iteration,
            ):
                return i
        return free[0] if free else None

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        i = self._pick(request)
        if i is None:
            return ProposalSession(
                note=f"replay: all {len(self.sessions)} recorded sessions already replayed"
            )
        self._used.add(i)
        rec = self.sessions[i]
        candidates = []
        for c in (rec.get("candidates") or [])[: request.n]:
            if not isinstance(c, dict):
                continue
            cand = candidate_from_record(c)
            if not request.archive.exists(cand.parent_id):
                cand = candidate_from_record({**c, "parent_id": request.default_parent})
            candidates.append(cand)
        where = f"cycle {rec.get('cycle')}, iteration {rec.get('iteration')}"
        note = f"replayed session {rec.get('session_id')} ({where}) from {self.path}"
        if rec.get("error") or rec.get("note"):
            note += f"; it ended: {rec.get('error') or rec.get('note')}"
        usage = ProposerUsageRecord(seconds=time.monotonic() - t0)
        again = {
            **{k: v for k, v in rec.items() if k != "candidate_index"},
            "proposer": self.name,
            "replayed_from": str(self.path),
            "replayed_session": rec.get("session_id"),
            "cycle": request.cycle,
            "iteration": request.iteration,
            "started": time.time(),
        }
        try:
            request.archive.write_session(request.iteration, again)
        except OSError:
            pass
        return ProposalSession(candidates=tuple(candidates), usage=usage, note=note)
