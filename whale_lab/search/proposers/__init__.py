"""Proposers for the harness phase: rules (offline default), llm, manual, claude-code."""

from __future__ import annotations

from whale_lab.config import Config
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    Proposer,
    ProposerUsageRecord,
)

__all__ = [
    "ProposalRequest",
    "ProposalSession",
    "ProposedCandidate",
    "Proposer",
    "ProposerUsageRecord",
    "make_proposer",
]


def make_proposer(cfg: Config) -> Proposer:
    """The proposer named by `proposer.kind`; a bad setting raises ValueError with the key."""
    kind = cfg.proposer.kind
    if kind == "rules":
        from whale_lab.search.proposers.rules import RulesProposer

        return RulesProposer()
    if kind == "llm":
        from whale_lab.search.proposers.llm import LLMProposer

        return LLMProposer(cfg.proposer)
    if kind == "manual":
        from whale_lab.search.proposers.manual import ManualProposer

        return ManualProposer()
    if kind == "claude-code":
        from whale_lab.search.proposers.claude_code import ClaudeCodeProposer

        return ClaudeCodeProposer(max_seconds=cfg.proposer.max_seconds)
    raise ValueError(f"proposer.kind: unknown proposer {kind!r}")
