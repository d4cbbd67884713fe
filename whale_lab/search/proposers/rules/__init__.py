"""The offline proposer: failure statistics from raw traces -> one code mechanism per candidate.

For machines with no LLM endpoint. It reads the parent's traces in the archive, counts each failure
kind (unparseable replies, format-failure endings, turn-cap hits, passages cut or hidden, tool
errors, illegal moves, wrong answers after too few searches, generations cut by the token cap,
prompts outgrowing the context) and, for the kinds it finds, writes a real change to the matching
surface: a parser that also reads the formats the model actually used, an observation format that
shows what was cut, more turns with a stop rule, feedback that shows the expected format, legal
moves annotated with checks and captures, and so on. One mechanism per candidate; the hypothesis
cites counts and trace ids. It reads what was already tried in the phase (and the reviewers'
reasons) so every iteration proposes something different.

The rules are grouped by the harness surface they change: `parser`, `feedback`, `prompts`,
`turn_budget`, `tool_io` and `chess` (the chess-only rules); `common` holds what they share and
`catalogue` orders them and holds the proposer. Everything is importable from this package.
"""

from __future__ import annotations

from whale_lab.search.proposers.rules.catalogue import CATALOG, MECHANISMS, RulesProposer
from whale_lab.search.proposers.rules.common import (
    Finding,
    FormatSpec,
    Mechanism,
    RuleContext,
    format_spec,
)

__all__ = [
    "CATALOG",
    "MECHANISMS",
    "Finding",
    "FormatSpec",
    "Mechanism",
    "RuleContext",
    "RulesProposer",
    "format_spec",
]
