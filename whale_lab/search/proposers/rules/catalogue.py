"""The catalogue of rule mechanisms, in proposal order, and the proposer that ranks them.

The order of CATALOG breaks ties between equally supported mechanisms, so it decides which edit
is proposed first; the surface modules only define the mechanisms.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from whale_lab.search.archive import SCORED_STATUSES, PhaseArchive
from whale_lab.search.codeedit import check_syntax
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.proposers.rules.chess import ANNOTATE_LEGAL_MOVES, ILLEGAL_MOVE_FEEDBACK
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    format_spec,
    pct,
    short,
)
from whale_lab.search.proposers.rules.feedback import FORMAT_FEEDBACK_EXAMPLE
from whale_lab.search.proposers.rules.parser import LENIENT_PARSER, TOOL_ARGUMENT_CLEANUP
from whale_lab.search.proposers.rules.prompts import (
    BREVITY_PROMPT,
    FORMAT_PROMPT_EXAMPLE,
    TOOL_USE_PROMPT,
    TURN_LIMIT_PROMPT,
)
from whale_lab.search.proposers.rules.tool_io import (
    MORE_EVIDENCE,
    SEARCH_AGAIN_RULE,
    TOOL_ERROR_VIEW,
)
from whale_lab.search.proposers.rules.turn_budget import (
    RECENT_CONTEXT_WINDOW,
    TURN_BUDGET_STOP_RULE,
)
from whale_lab.search.trace_stats import failure_stats

CATALOG: tuple[Mechanism, ...] = (
    LENIENT_PARSER,
    MORE_EVIDENCE,
    TURN_BUDGET_STOP_RULE,
    ANNOTATE_LEGAL_MOVES,
    ILLEGAL_MOVE_FEEDBACK,
    FORMAT_FEEDBACK_EXAMPLE,
    SEARCH_AGAIN_RULE,
    TOOL_ERROR_VIEW,
    TOOL_ARGUMENT_CLEANUP,
    RECENT_CONTEXT_WINDOW,
    FORMAT_PROMPT_EXAMPLE,
    TOOL_USE_PROMPT,
    TURN_LIMIT_PROMPT,
    BREVITY_PROMPT,
)
MECHANISMS = {m.name: m for m in CATALOG}

_SURFACE_WORDS = {
    "parser": "parser",
    "parse": "parser",
    "prompt": "prompts",
    "feedback": "feedback",
    "observation": "tool_io",
    "passage": "tool_io",
    "tool": "tool_io",
    "context": "context",
    "turn": "termination",
    "termination": "termination",
}
_AVOID = re.compile(
    r"\b(?:no|avoid|not|never|stop|don't|do not)\b[^.;]{0,30}?\b("
    + "|".join(_SURFACE_WORDS)
    + r")",
    re.IGNORECASE,
)


@dataclass
class _History:
    excluded: dict[str, str] = field(default_factory=dict)  # mechanism -> why
    helped: dict[str, str] = field(default_factory=dict)  # mechanism -> where it helped
    avoid_surfaces: dict[str, str] = field(default_factory=dict)  # surface -> reviewer reason
    notes: list[str] = field(default_factory=list)


def _history(archive: PhaseArchive, parent_id: str) -> _History:
    h = _History()
    lineage = set(archive.lineage(parent_id))
    for rec in archive.records():
        reason = rec.decision.get("reason", "") or rec.status_reason
        if rec.status == "rejected":
            for m in _AVOID.finditer(reason or ""):
                h.avoid_surfaces[_SURFACE_WORDS[m.group(1).lower()]] = reason
            if reason:
                h.notes.append(
                    f"{rec.id} ({rec.mechanism or rec.surface}) was rejected: {short(reason)}"
                )
        if not rec.mechanism:
            continue
        if rec.id in lineage:
            h.excluded[rec.mechanism] = f"already in the parent's lineage ({rec.id})"
        elif rec.status in ("rejected", "invalid", "crashed"):
            h.excluded[rec.mechanism] = f"{rec.id} was {rec.status}: {short(reason)}"
        elif rec.status in SCORED_STATUSES:
            parent = archive.record(rec.parent_id) if rec.parent_id else None
            base = parent.success_rate if parent else None
            mine = rec.success_rate
            if base is not None and mine is not None and mine < base:
                h.excluded[rec.mechanism] = f"{rec.id} scored {mine:.0%} vs its parent's {base:.0%}"
                h.notes.append(f"{rec.id} ({rec.mechanism}) scored worse than {rec.parent_id}.")
            elif rec.parent_id == parent_id:
                h.excluded[rec.mechanism] = f"already tried on {parent_id} ({rec.id})"
            elif base is not None and mine is not None and mine > base:
                h.helped[rec.mechanism] = (
                    f"on {rec.parent_id} it raised success {base:.0%} -> {mine:.0%} ({rec.id})"
                )
        else:
            h.excluded[rec.mechanism] = f"{rec.id} is still {rec.status}"
    return h


def _evidence_source(archive: PhaseArchive, parent_id: str) -> str:
    """The nearest candidate in the lineage with traces (a parent may be pinned unscored)."""
    for cid in archive.lineage(parent_id):
        if (archive.folder(cid) / "traces.jsonl").exists():
            return cid
    return parent_id


def _shown_sample(traces: list[dict[str, Any]], n: int = 20) -> str:
    parts = []
    for tr in traces[:n]:
        for turn in (tr.get("turns") or [])[:1]:
            for m in turn.get("prompt") or []:
                parts.append(str(m.get("content", "")))
    return "\n".join(parts)


class RulesProposer:
    """A fixed catalogue of edits, each triggered by a failure pattern in the traces.

    Deterministic and offline: a baseline and a stand-in for an LLM proposer, one mechanism per
    candidate, never one that the parent's limits leave no room to act.
    """

    name = "rules"

    def __init__(self, catalog: tuple[Mechanism, ...] = CATALOG) -> None:
        self.catalog = catalog

    def rank(
        self, request: ProposalRequest, parent_id: str | None = None
    ) -> tuple[list[tuple[Mechanism, Finding]], RuleContext, _History]:
        """Untried mechanisms with evidence in `parent_id`'s traces, strongest first."""
        archive = request.archive
        parent_id = parent_id or request.default_parent or (archive.best() or "")
        if not parent_id:
            raise ValueError("the archive has no candidate to build on")
        source = _evidence_source(archive, parent_id)
        traces = list(archive.traces(source))
        stats = failure_stats(source, traces)
        code = archive.code(parent_id)
        ctx = RuleContext(
            request.domain,
            parent_id,
            code,
            stats,
            format_spec(request.domain, code, stats),
            _shown_sample(traces),
        )
        hist = _history(archive, parent_id)
        ranked: list[tuple[float, int, Mechanism, Finding]] = []
        for i, mech in enumerate(self.catalog):
            if not mech.applies_to(request.domain) or mech.name in hist.excluded:
                continue
            if request.prompt_only and mech.surface != "prompts":
                continue
            if mech.surface in hist.avoid_surfaces:
                continue
            finding = mech.find(ctx)
            if finding is None or finding.count <= 0:
                continue
            score = finding.count / max(1, finding.total) + (0.5 if mech.name in hist.helped else 0)
            ranked.append((score, i, mech, finding))
        ranked.sort(key=lambda r: (-r[0], r[1]))
        return [(m, f) for _s, _i, m, f in ranked], ctx, hist

    @staticmethod
    def parents(request: ProposalRequest) -> list[str]:
        """The best candidate first, then the other scored ones (by success, then fewer turns).

        When the best has no untried mechanism left, building on a runner-up stacks a second
        mechanism on one that held its ground, instead of wasting the iteration.
        """
        archive = request.archive
        first = request.default_parent or archive.best() or ""
        scored = [
            r
            for r in archive.records()
            if r.status in SCORED_STATUSES and r.success_rate is not None and r.id != first
        ]
        scored.sort(key=lambda r: (-(r.success_rate or 0.0), r.mean_turns or 0.0, int(r.id[1:])))
        return ([first] if first else []) + [r.id for r in scored]

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        out: list[ProposedCandidate] = []
        problems: list[str] = []
        chosen: set[str] = set()
        parents = self.parents(request)
        if not parents:
            return ProposalSession(
                error="rules proposer: the archive has no candidate to build on",
                usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
            )
        for parent_id in parents:
            if len(out) >= request.n:
                break
            try:
                ranked, ctx, hist = self.rank(request, parent_id)
            except (ValueError, SyntaxError) as exc:
                problems.append(f"{parent_id}: {exc}")
                continue
            for mech, finding in ranked:
                if len(out) >= request.n:
                    break
                if mech.name in chosen:
                    continue
                try:
                    code, change = mech.build(ctx, finding)
                    check_syntax(code)
                except (ValueError, SyntaxError) as exc:
                    problems.append(f"{mech.name} on {parent_id}: {exc}")
                    continue
                if code == ctx.parent_code:
                    continue
                chosen.add(mech.name)
                out.append(
                    ProposedCandidate(
                        code=code,
                        hypothesis=self._hypothesis(mech, finding, ctx, hist, change),
                        parent_id=ctx.parent_id,
                        surface=mech.surface,
                        mechanism=mech.name,
                        cited_traces=finding.cited,
                    )
                )
        note = ""
        if len(out) < request.n:
            note = (
                f"rules proposer found {len(out)} untried mechanism(s) with evidence in the "
                f"traces of {', '.join(parents)} that the parent's limits let act; asked for "
                f"{request.n}"
            )
            if problems:
                note += "; " + "; ".join(problems)
        return ProposalSession(
            candidates=tuple(out),
            note=note,
            usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
        )

    @staticmethod
    def _hypothesis(
        mech: Mechanism, f: Finding, ctx: RuleContext, hist: _History, change: str
    ) -> str:
        st = ctx.stats
        lines = [
            f"{mech.title}.",
            "",
            f"Surface: {mech.surface}. Mechanism: {mech.name}. Parent: {ctx.parent_id}.",
            "",
            f"Evidence ({st.candidate_id}: {st.episodes} harness episodes, success "
            f"{st.success_rate:.0%}, mean {st.mean_turns:.1f} turns): {f.evidence}",
            f"Affected: {pct(f.count, f.total)}. Cited traces: {', '.join(f.cited) or '-'}.",
            "",
            f"Change: {change}",
            "",
            f"Expected: {mech.expected}.",
        ]
        if mech.name in hist.helped:
            lines.append(f"Earlier in this phase {hist.helped[mech.name]}.")
        if hist.notes:
            lines += ["", "Read from the archive: " + " ".join(hist.notes[-4:])]
        return "\n".join(lines)
