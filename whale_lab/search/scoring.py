"""What a candidate's scoring leaves in the archive: its scores, its status, its event.

A candidate whose episodes mostly end in harness errors is `crashed`, not `evaluated`, so it can
never be accepted on the strength of the episodes that happened to survive.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from whale_lab.events import CandidateScored
from whale_lab.metrics import archive_safe
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.validate import summarise_traces

# A candidate with at least this share of harness-error episodes is recorded as crashed.
CRASH_SHARE = 0.5


def record_crash(archive: PhaseArchive, cid: str, error: str) -> CandidateScored:
    """Scoring raised before any report: the candidate crashed, with the error as its reason."""
    scores = {
        "success_rate": 0.0,
        "mean_turns": 0.0,
        "tokens": 0,
        "rollouts": 0,
        "failures": {},
        "error": error,
    }
    archive.write_json(cid, "scores", scores)
    archive.set_status(cid, "crashed", error)
    return CandidateScored(
        candidate_id=cid, success_rate=0.0, mean_turns=0.0, tokens=0, rollouts=0, status="crashed"
    )


def write_scores(archive: PhaseArchive, cid: str, report: Any) -> dict[str, Any]:
    """The candidate's scores.json; returns the trace summary its status is read from. Proposers
    read this file, so diagnostics computed from the reference answers stay engine-side."""
    summary = summarise_traces([t.to_dict() for t in report.traces])
    scores = {
        **summary,
        "success_rate": report.success_rate,
        "mean_at_k": report.mean_at_k,
        "pass_at_k": report.pass_at_k,
        "mean_turns": report.mean_turns,
        "tokens": report.tokens,
        "rollouts": report.rollouts,
        "k": report.k,
        "n_tasks": report.n_tasks,
        "seconds": round(report.seconds, 3),
        "diagnostics": archive_safe(dict(report.diagnostics)),
    }
    archive.write_json(cid, "scores", scores)
    return summary


def set_scored_status(
    archive: PhaseArchive, cid: str, report: Any, summary: dict[str, Any]
) -> CandidateScored:
    """`evaluated`, or `crashed` when scoring produced nothing or mostly harness errors."""
    crashed = summary["stop_reasons"].get("harness_error", 0)
    status = "evaluated"
    if report.rollouts == 0:
        status = "crashed"
        archive.set_status(cid, status, "scoring produced no episode")
    elif crashed / report.rollouts >= CRASH_SHARE:
        first = summary["harness_errors"][0] if summary["harness_errors"] else ""
        status = "crashed"
        archive.set_status(
            cid, status, f"{crashed} of {report.rollouts} episodes ended in a harness error: {first}"
        )
    else:
        archive.set_status(cid, status)
    return CandidateScored(
        candidate_id=cid,
        success_rate=report.success_rate,
        mean_turns=report.mean_turns,
        tokens=report.tokens,
        rollouts=report.rollouts,
        status=status,
        failures=dict(summary["failures"]),
    )


def transcript_of(archive: PhaseArchive, cid: str, run_root: Path) -> str:
    """Where the proposer session that wrote `cid` is recorded (relative to the run), or ""."""
    path = archive.folder(cid) / "proposer_transcript.json"
    if not path.is_file():
        return ""
    try:
        return path.relative_to(run_root).as_posix()
    except ValueError:
        return str(path)
