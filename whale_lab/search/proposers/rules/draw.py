"""Catalogue draws without search: the best-of-N control that search is compared with.

`DrawProposer` spends the same proposals a searching proposer would, but reads no score: each
candidate is one catalogue mechanism drawn uniformly at random (seeded) from those the incoming
harness's traces give evidence for, built on the incoming harness. No ranking by evidence
strength, no building on the best so far, no exclusion of what scored badly. Mechanisms are
drawn without replacement; once the incoming harness has none left, a draw stacks one on an
earlier draw picked at random (still without looking at its score). The phase then scores each
candidate once on the harness split and keeps the best under the phase's acceptance rule, so the
difference between a schedule and `best-of-n` is what search adds over luck.
"""

from __future__ import annotations

import random
import time

from whale_lab.search.archive import INCOMING, PhaseArchive
from whale_lab.search.codeedit import check_syntax
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.proposers.rules.catalogue import CATALOG, _evidence_source, _shown_sample
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    format_spec,
    pct,
)
from whale_lab.search.trace_stats import failure_stats

DRAW = "draw"  # the proposer name recorded on every drawn candidate


class DrawProposer:
    """Uniform, seeded catalogue draws on the incoming harness; never reads a score."""

    name = DRAW

    def __init__(self, seed: int = 0, catalog: tuple[Mechanism, ...] = CATALOG) -> None:
        self.seed = int(seed)
        self.catalog = catalog

    def _context(self, archive: PhaseArchive, domain: str, parent_id: str) -> RuleContext:
        source = _evidence_source(archive, parent_id)
        traces = list(archive.traces(source))
        stats = failure_stats(source, traces)
        code = archive.code(parent_id)
        return RuleContext(
            domain, parent_id, code, stats, format_spec(domain, code, stats), _shown_sample(traces)
        )

    def _options(
        self, request: ProposalRequest, parent_id: str
    ) -> tuple[RuleContext, list[tuple[Mechanism, Finding]]]:
        """Mechanisms with evidence in the parent's traces not yet in its lineage, catalogue order."""
        archive = request.archive
        ctx = self._context(archive, request.domain, parent_id)
        taken = {archive.record(c).mechanism for c in archive.lineage(parent_id)}
        taken |= {r.mechanism for r in archive.records() if r.parent_id == parent_id}
        out = []
        for mech in self.catalog:
            if not mech.applies_to(request.domain) or mech.name in taken:
                continue
            if request.prompt_only and mech.surface != "prompts":
                continue
            finding = mech.find(ctx)
            if finding is not None and finding.count > 0:
                out.append((mech, finding))
        return ctx, out

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        archive = request.archive
        rng = random.Random(f"best-of-n:{self.seed}:{request.cycle}:{request.iteration}")
        ids = archive.ids()
        incoming = next((c for c in ids if archive.meta(c).get("proposer") == INCOMING), "")
        if not incoming:
            return ProposalSession(
                error="draw proposer: the archive has no incoming harness to draw on",
                usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
            )
        earlier = [c for c in ids if archive.meta(c).get("proposer") == DRAW]
        rng.shuffle(earlier)
        out: list[ProposedCandidate] = []
        problems: list[str] = []
        for parent_id in [incoming, *earlier]:
            if len(out) >= request.n:
                break
            try:
                ctx, options = self._options(request, parent_id)
            except (ValueError, SyntaxError, OSError) as exc:
                problems.append(f"{parent_id}: {exc}")
                continue
            rng.shuffle(options)
            for mech, finding in options:
                if len(out) >= request.n:
                    break
                try:
                    code, change = mech.build(ctx, finding)
                    check_syntax(code)
                except (ValueError, SyntaxError) as exc:
                    problems.append(f"{mech.name} on {parent_id}: {exc}")
                    continue
                if code == ctx.parent_code:
                    continue
                out.append(
                    ProposedCandidate(
                        code=code,
                        hypothesis=(
                            f"{mech.title} (drawn at random on {parent_id}, no score read; "
                            f"{pct(finding.count, finding.total)} of its episodes show the "
                            f"failure).\n\nChange: {change}"
                        ),
                        parent_id=parent_id,
                        surface=mech.surface,
                        mechanism=mech.name,
                        cited_traces=finding.cited,
                    )
                )
        note = ""
        if len(out) < request.n:
            note = (
                f"draw proposer: {len(out)} of {request.n} draws had an untried mechanism with "
                "evidence"
            )
            if problems:
                note += "; " + "; ".join(problems)
        return ProposalSession(
            candidates=tuple(out),
            note=note,
            usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
        )
