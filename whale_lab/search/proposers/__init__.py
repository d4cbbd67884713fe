"""Proposers for the harness phase: rules (offline default), llm, manual, claude-code, replay.

`proposer.replay` set to a recorded phase archive or run folder replaces whatever
`proposer.kind` says with the replay of its sessions (`proposers/replay.py`).
"""

from __future__ import annotations

from collections.abc import Callable

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
    "PROPOSERS",
    "ProposerUsageRecord",
    "make_proposer",
]


def _rules(cfg: Config) -> Proposer:
    from whale_lab.search.proposers.rules import RulesProposer

    return RulesProposer()


def _llm(cfg: Config) -> Proposer:
    from whale_lab.search.proposers.llm import LLMProposer

    return LLMProposer(cfg.proposer)


def _manual(cfg: Config) -> Proposer:
    from whale_lab.search.proposers.manual import ManualProposer

    return ManualProposer()


def _claude_code(cfg: Config) -> Proposer:
    from whale_lab.search.proposers.claude_code import ClaudeCodeProposer

    return ClaudeCodeProposer(max_seconds=cfg.proposer.max_seconds)


#: `proposer.kind` -> factory; a new proposer is one module and one entry here.
PROPOSERS: dict[str, Callable[[Config], Proposer]] = {
    "rules": _rules,
    "llm": _llm,
    "manual": _manual,
    "claude-code": _claude_code,
}


def make_proposer(cfg: Config) -> Proposer:
    """The proposer named by `proposer.kind`; a bad setting raises ValueError with the key."""
    if cfg.proposer.replay.strip():
        from whale_lab.search.proposers.replay import ReplayProposer

        return ReplayProposer(cfg.proposer.replay.strip())
    kind = cfg.proposer.kind
    factory = PROPOSERS.get(kind)
    if factory is None:
        raise ValueError(f"proposer.kind: unknown proposer {kind!r}")
    return factory(cfg)
