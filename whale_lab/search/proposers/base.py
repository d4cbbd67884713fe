"""The proposer seam: read the phase archive, return candidate harness files with hypotheses.

Proposers never write into `candidates/` themselves; the phase adds what they return, so every
candidate (rules, LLM, human or `claude` CLI) gets the same diff, validation and review.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from whale_lab.search.archive import PhaseArchive


@dataclass(frozen=True)
class ProposalRequest:
    """What one proposer session is asked to do."""

    archive: PhaseArchive
    n: int
    domain: str
    iteration: int
    cycle: int = 0
    prompt_only: bool = False
    # The candidate proposers should build on by default (the phase's best so far).
    default_parent: str = ""
    # Reviewers' requests in words for this session (`search/steering.py`); a proposer that
    # follows them says so with `reads_steer = True`.
    steer: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProposedCandidate:
    code: str
    hypothesis: str
    parent_id: str
    surface: str
    mechanism: str = ""
    cited_traces: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProposerUsageRecord:
    """Compute spent by one session; written to the run's ledger beside the rollout counts."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    tool_calls: int = 0
    requests: int = 0


@dataclass(frozen=True)
class ProposalSession:
    candidates: tuple[ProposedCandidate, ...] = ()
    usage: ProposerUsageRecord = field(default_factory=ProposerUsageRecord)
    # Why the session produced fewer candidates than asked (budget, a malformed reply, skipped, ...).
    note: str = ""
    error: str = ""


class Proposer(Protocol):
    name: str

    def propose(self, request: ProposalRequest) -> ProposalSession:
        """One session; must not raise for a model's or a server's misbehaviour (record it)."""
        ...
