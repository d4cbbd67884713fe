"""Feedback rules: after a malformed reply, show the exact form a readable one takes.

Feedback is read on the next turn and only while the retry budget lasts, so the rule raises
FORMAT_RETRY_BUDGET in the same edit and is not proposed on a parent with a single turn. Chess's
illegal-move feedback lives in `chess.py` with the other chess-only rules.
"""

from __future__ import annotations

from whale_lab.search.codeedit import append_block, wrap_function
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    quote,
    raise_retry_budget,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

# The malformed reply, then a retry that reads the feedback.
_FEEDBACK_TURNS = 2


def _find_format_feedback(ctx: RuleContext) -> Finding | None:
    inv = ctx.stats.invalid_turns
    if not inv or too_few_turns(ctx, _FEEDBACK_TURNS):
        return None
    ff = ctx.stats.format_failure_eps
    ev = (
        f"{len(inv)} replies were unparseable and {len(ff)} of {ctx.stats.episodes} episodes "
        "ended in format_failure: the model was told its reply was malformed but not what the "
        "right form looks like, and had few retries to fix it."
    )
    return Finding(
        count=max(len(ff), 1),
        total=ctx.stats.episodes,
        cited=tuple(cite(ff or [t for t, _r, _f in inv])),
        evidence=ev,
    )


def _build_format_feedback(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_feedback", "plain", ["kind", "detail"])
    body = (
        f"_FORMAT_EXAMPLE = {quote(ctx.spec.example())}\n\n\n"
        "def format_feedback(kind, detail, **context):\n"
        '    """After an unreadable reply, say exactly what a readable one looks like."""\n'
        f"    text = {prev}\n"
        '    if kind == "format":\n'
        '        lead = (str(text).strip() + " ") if str(text).strip() else ""\n'
        '        return lead + "Your last reply could not be read. " + _FORMAT_EXAMPLE\n'
        "    return text\n"
    )
    code, budget = raise_retry_budget(append_block(code, body), "FORMAT_RETRY_BUDGET")
    change = (
        f"format_feedback now follows a malformed reply with the exact expected form "
        f"({ctx.spec.example()!r}), and {budget} so the model can use that feedback."
    )
    return code, change


FORMAT_FEEDBACK_EXAMPLE = Mechanism(
    "format_feedback_example",
    "feedback",
    "Feedback that shows the expected format",
    (),
    _find_format_feedback,
    _build_format_feedback,
    "malformed replies get corrected on the retry instead of ending the episode",
)
