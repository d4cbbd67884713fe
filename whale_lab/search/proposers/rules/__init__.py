"""The `rules` proposer: a deterministic catalogue of trace-triggered mechanisms.

A baseline, and the offline stand-in for an LLM proposer on machines with no endpoint. It does not
read the parent's code the way an LLM proposer does: it counts failure kinds in the parent's traces
(unparseable replies, format-failure endings, turn-cap hits, passages cut or hidden, tool errors,
illegal moves, wrong answers after too few searches, generations cut by the token cap, prompts
outgrowing the context) and matches each kind it finds to the edits a fixed catalogue holds for
it: a parser that also reads the forms the model actually wrote, an observation that shows what was
cut, more turns with a stop rule, feedback that shows the expected form, and so on. From the
parent's code it reads only what an edit needs: its prompts and tags, the function it wraps, and
the limits (MAX_TURNS, the retry budgets) that decide whether the edit can act there. An edit that needs more turns than the parent
allows is not proposed, except where the extra turn is the edit's idea (the second-search rule
raises MAX_TURNS to 3; the feedback rules raise their retry budgets). One mechanism per candidate;
the hypothesis cites counts and trace ids. Same archive in, same candidates out; it reads what was
already tried in the phase (and the reviewers' reasons) so each iteration proposes something new.

The rules are grouped by the harness surface they change: `parser`, `feedback`, `prompts`,
`turn_budget`, `tool_io` and `chess` (the chess-only rules); `common` holds what they share (the
limit helpers too), `catalogue` orders them and holds the proposer, and `draw` is the best-of-n
control that draws from the same catalogue at random. Everything is importable from this package.
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
