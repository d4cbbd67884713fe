"""Chess-only rules: legal moves annotated with checks and captures, and illegal-move feedback.

They read the legal-move list the chess harness shows and the chess environment's feedback
kinds, so they apply to no other domain. The illegal-move hint is read on a retry, so that rule
raises ILLEGAL_MOVE_RETRY_BUDGET in the same edit and is not proposed on a single-turn parent.
"""

from __future__ import annotations

import re

from whale_lab.search.codeedit import append_block, ensure_import, wrap_function
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    quote,
    raise_retry_budget,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

# The illegal move, then a retry that reads the hint.
_RETRY_TURNS = 2

_LEGAL_LINE = re.compile(r"^\s*-\s*\[[a-h][1-8][a-h][1-8][qrbn]?\]\s*SAN=\S+", re.MULTILINE)


def _find_annotate_moves(ctx: RuleContext) -> Finding | None:
    if ctx.domain != "chess" or not _LEGAL_LINE.search(ctx.shown_text):
        return None
    st = ctx.stats
    eps = list(dict.fromkeys(st.wrong_eps + st.illegal_eps))
    if not eps:
        return None
    ev = (
        f"{len(st.wrong_eps)} episodes ended on a legal but wrong move and "
        f"{len(st.illegal_eps)} had illegal moves, out of {st.episodes}; the legal-move list "
        "shows plain SAN, so checks, captures and promotions are easy to miss."
    )
    return Finding(count=len(eps), total=st.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_annotate_moves(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code = ensure_import(ctx.parent_code, "re")
    code, prev = wrap_function(code, "format_observation", "plain", ["observation"])
    body = (
        '_LEGAL_MOVE_LINE = re.compile(r"^(\\s*-\\s*\\[([a-h][1-8][a-h][1-8][qrbn]?)\\]\\s*'
        'SAN=(\\S+))\\s*$")\n\n\n'
        "def format_observation(observation, **context):\n"
        '    """Tag each legal move with check / mate / capture / promotion and list those first."""\n'
        f"    text = str({prev})\n"
        "    out, forcing = [], []\n"
        "    for line in text.splitlines():\n"
        "        m = _LEGAL_MOVE_LINE.match(line)\n"
        "        if m:\n"
        "            san, tags = m.group(3), []\n"
        '            if "#" in san:\n'
        '                tags.append("mate")\n'
        '            elif "+" in san:\n'
        '                tags.append("check")\n'
        '            if "x" in san:\n'
        '                tags.append("capture")\n'
        '            if "=" in san:\n'
        '                tags.append("promotion")\n'
        "            if tags:\n"
        '                line = m.group(1) + "  (" + ", ".join(tags) + ")"\n'
        '                forcing.append(m.group(2) + " " + "/".join(tags))\n'
        "        out.append(line)\n"
        "    if forcing:\n"
        '        out.append("Forcing moves (checks, captures, promotions): " + ", ".join(forcing))\n'
        '    return "\\n".join(out)\n'
    )
    return append_block(code, body), (
        "format_observation keeps the parent's board view and tags every legal move that gives "
        "check or mate, captures or promotes, with a summary line of those forcing moves. It "
        "never picks a move."
    )


def _find_illegal_feedback(ctx: RuleContext) -> Finding | None:
    n = ctx.stats.illegal_turns
    if n <= 0 or too_few_turns(ctx, _RETRY_TURNS):
        return None
    ev = (
        f"{n} illegal moves in {len(ctx.stats.illegal_eps)} episodes; "
        f"{ctx.stats.stop_reasons.get('illegal_moves', 0)} episodes ended because the illegal-move "
        "budget ran out."
    )
    return Finding(
        count=len(ctx.stats.illegal_eps),
        total=ctx.stats.episodes,
        cited=tuple(cite(ctx.stats.illegal_eps)),
        evidence=ev,
    )


def _build_illegal_feedback(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_feedback", "plain", ["kind", "detail"])
    tag = ctx.spec.answer_tag or "move"
    hint = (
        f"That move is not legal in this position. Pick one move from the legal-move list and "
        f"copy its UCI code exactly as written in brackets, for example <{tag}>e2e4</{tag}>."
    )
    body = (
        f"_ILLEGAL_HINT = {quote(hint)}\n\n\n"
        "def format_feedback(kind, detail, **context):\n"
        '    """After an illegal move, point the model back to the legal-move list."""\n'
        f"    text = {prev}\n"
        '    if kind == "illegal":\n'
        '        lead = (str(text).strip() + " ") if str(text).strip() else ""\n'
        "        return lead + _ILLEGAL_HINT\n"
        "    return text\n"
    )
    code, budget = raise_retry_budget(append_block(code, body), "ILLEGAL_MOVE_RETRY_BUDGET")
    return code, (
        f"format_feedback now tells the model to copy a move from the legal-move list "
        f"after an illegal move; {budget} so the hint can be used."
    )


ANNOTATE_LEGAL_MOVES = Mechanism(
    "annotate_legal_moves",
    "tool_io",
    "Annotate legal moves with checks and captures",
    ("chess",),
    _find_annotate_moves,
    _build_annotate_moves,
    "forcing moves stand out, so fewer wrong and illegal moves",
)


ILLEGAL_MOVE_FEEDBACK = Mechanism(
    "illegal_move_feedback",
    "feedback",
    "Point illegal moves back to the legal list",
    ("chess",),
    _find_illegal_feedback,
    _build_illegal_feedback,
    "illegal moves get corrected instead of ending the episode",
)
