"""Episode-length rules: more turns with a final-turn stop rule, and a recent-context window.

Both wrap the parent's `select_context`: one for episodes that end on the turn cap, the other
for episodes whose prompt outgrows the model's context. The first raises MAX_TURNS itself (up to
a per-domain cap). The window keeps the last 4 messages after the task, which drops nothing
before turn 4, so it is not proposed on a parent whose MAX_TURNS ends every episode sooner.
"""

from __future__ import annotations

from whale_lab.search.codeedit import append_block, get_constant, set_constant, wrap_function
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    quote,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

_TURN_CAPS = {"chess": 18}
_DEFAULT_TURN_CAP = 10
_KEEP_RECENT = 4  # messages the context window keeps after the system message and the task
# Turn t's prompt holds 2 * (t - 1) messages after the task (each reply and what answered it), so
# the window first drops one on this turn.
_WINDOW_MIN_TURNS = _KEEP_RECENT // 2 + 2


def _find_turn_budget(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.turn_cap_eps
    if not eps:
        return None
    turns = int(get_constant(ctx.parent_code, "MAX_TURNS", 4) or 4)
    cap = _TURN_CAPS.get(ctx.domain, _DEFAULT_TURN_CAP)
    if turns >= cap:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes stopped at MAX_TURNS={turns} still "
        "working (turn_cap), so they scored 0 whatever they had found."
    )
    return Finding(
        count=len(eps),
        total=ctx.stats.episodes,
        cited=tuple(cite(eps)),
        evidence=ev,
        params={"turns": turns, "new": min(cap, max(turns + 2, turns * 2))},
    )


def _build_turn_budget(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "select_context", "all", ["messages"])
    final = (
        f"This is your last reply: give your final answer now as {ctx.spec.answer_form}."
        if ctx.domain != "chess"
        else ""
    )
    body = (
        f"_FINAL_TURN_NOTE = {quote(final)}\n\n\n"
        "def select_context(messages, **context):\n"
        '    """Tell the model which turn it is on, and to answer on the last one."""\n'
        f"    msgs = [dict(m) for m in {prev}]\n"
        '    turn, cap = context.get("turn_count"), context.get("max_turns")\n'
        "    if not isinstance(turn, int) or not isinstance(cap, int):\n"
        "        return msgs\n"
        '    note = f"(Reply {turn} of {cap}.)"\n'
        "    if turn >= cap and _FINAL_TURN_NOTE:\n"
        '        note = note + " " + _FINAL_TURN_NOTE\n'
        "    for m in reversed(msgs):\n"
        '        if m.get("role") == "user":\n'
        '            m["content"] = str(m.get("content", "")).rstrip() + "\\n\\n" + note\n'
        "            break\n"
        "    return msgs\n"
    )
    code = append_block(code, body)
    code = set_constant(code, "MAX_TURNS", f.params["new"])
    return code, (
        f"MAX_TURNS goes {f.params['turns']} -> {f.params['new']}, with a stop rule: "
        "select_context marks each user message with the turn number and, on the last "
        "turn, tells the model to answer now."
    )


def _find_context_window(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.context_cap_eps
    if not eps or too_few_turns(ctx, _WINDOW_MIN_TURNS):
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes ended because the prompt no longer fit "
        "the model's context (token_cap), after "
        f"{ctx.stats.mean_turns:.1f} turns on average."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_context_window(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "select_context", "full", ["messages"])
    body = (
        f"_KEEP_RECENT = {_KEEP_RECENT}\n\n\n"
        "def select_context(messages, **context):\n"
        '    """System and first user message, then only the most recent exchanges."""\n'
        f"    msgs = list({prev})\n"
        '    head = msgs[:1] if msgs and msgs[0].get("role") == "user" else msgs[:2]\n'
        "    rest = msgs[len(head):]\n"
        "    if len(rest) <= _KEEP_RECENT:\n"
        "        return msgs\n"
        "    dropped = len(rest) - _KEEP_RECENT\n"
        '    note = {"role": "user", "content": f"({dropped} earlier messages omitted.)"}\n'
        "    tail = rest[-_KEEP_RECENT:]\n"
        '    if tail and tail[0].get("role") == "user":\n'
        '        tail = [dict(tail[0], content=note["content"] + "\\n" + str(tail[0].get("content", "")))]'
        " + tail[1:]\n"
        "        return head + tail\n"
        "    return head + [note] + tail\n"
    )
    return append_block(code, body), (
        f"select_context keeps the system message, the task, and the last {_KEEP_RECENT} "
        "messages, with a note saying how many were dropped, so long episodes stay inside the "
        "context."
    )


TURN_BUDGET_STOP_RULE = Mechanism(
    "turn_budget_stop_rule",
    "termination",
    "More turns, with a final-turn stop rule",
    (),
    _find_turn_budget,
    _build_turn_budget,
    "episodes that ran out of turns finish with an answer",
)


RECENT_CONTEXT_WINDOW = Mechanism(
    "recent_context_window",
    "context",
    "Keep only recent messages in long episodes",
    (),
    _find_context_window,
    _build_context_window,
    "long episodes no longer end on the context limit",
)
