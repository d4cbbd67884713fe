"""Prompt rules: paragraphs added to SYSTEM_PROMPT (format, tool use, turn limit, brevity).

These are the only rules a prompt-only phase may propose. The tool-use procedure needs a turn
to read a tool result, so it is not proposed on a single-turn parent, and it asks for a second
search only where MAX_TURNS leaves a turn for one.
"""

from __future__ import annotations

from whale_lab.search.codeedit import get_constant
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    add_to_system_prompt,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

_TOOL_TURNS = 2  # a tool call, then a turn that reads its result and answers
_SECOND_SEARCH_TURNS = 3  # a search, a second search, then the answer


def _find_format_prompt(ctx: RuleContext) -> Finding | None:
    inv = ctx.stats.invalid_turns
    if not inv:
        return None
    eps = {t for t, _r, _f in inv}
    ev = (
        f"{len(inv)} replies in {len(eps)} of {ctx.stats.episodes} episodes did not follow the "
        "required form; the prompt never shows a complete example of it."
    )
    return Finding(
        count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(sorted(eps))), evidence=ev
    )


def _build_format_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    text = "Answer format. " + ctx.spec.example() + " Write nothing after the closing tag."
    return add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT gains a format paragraph with a complete example: {text!r}"
    )


def _find_brevity(ctx: RuleContext) -> Finding | None:
    cut = ctx.stats.length_cut_turns
    if not cut:
        return None
    eps = set(cut)
    ev = (
        f"{len(cut)} generations in {len(eps)} of {ctx.stats.episodes} episodes hit the "
        "max_new_tokens cap before the reply was complete."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(cut)), evidence=ev)


def _build_brevity(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    text = (
        "Keep every reply short: at most two sentences of reasoning, then the tag. "
        + ctx.spec.example()
    )
    return add_to_system_prompt(ctx.parent_code, text), (
        "SYSTEM_PROMPT now asks for short replies that end with the tag, so the tag is written "
        "before the token cap."
    )


def _find_tool_prompt(ctx: RuleContext) -> Finding | None:
    if not ctx.spec.tool or too_few_turns(ctx, _TOOL_TURNS):
        return None
    eps = ctx.stats.wrong_no_tool_eps if ctx.domain == "math" else ctx.stats.wrong_few_tools_eps
    if not eps:
        return None
    how = "without calling the tool" if ctx.domain == "math" else "after at most one search"
    ev = (
        f"{len(eps)} of {len(ctx.stats.wrong_eps)} wrong answers were given {how} "
        f"(success {ctx.stats.success_rate:.0%} over {ctx.stats.episodes} episodes)."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_tool_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    if ctx.domain == "math":
        text = (
            f"Work it out with the tool: write {ctx.spec.tool_form}, read the printed result, "
            f"then give the final answer as {ctx.spec.answer_form}."
        )
    else:
        second = (
            ""
            if too_few_turns(ctx, _SECOND_SEARCH_TURNS)
            else " If the passages mention another entity that the question depends on, search "
            "for that entity too."
        )
        text = (
            f"Look things up before answering: search with {ctx.spec.tool_form}.{second} Answer "
            f"with {ctx.spec.answer_form}, using a name or phrase copied from a passage."
        )
    return add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT gains a short tool-use procedure: {text!r}"
    )


def _find_turn_prompt(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.turn_cap_eps
    if not eps:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes hit the turn cap without a final "
        "answer; the prompt never says how many turns there are."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_turn_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    turns = int(get_constant(ctx.parent_code, "MAX_TURNS", 4) or 4)
    text = (
        f"You have at most {turns} replies in total. Give your final answer "
        f"({ctx.spec.answer_form}) no later than reply {turns}; never end on a tool call."
    )
    return add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT now states the turn limit and when to answer: {text!r}"
    )


FORMAT_PROMPT_EXAMPLE = Mechanism(
    "format_prompt_example",
    "prompts",
    "State the reply format with an example",
    (),
    _find_format_prompt,
    _build_format_prompt,
    "fewer unparseable replies",
)


TOOL_USE_PROMPT = Mechanism(
    "tool_use_prompt",
    "prompts",
    "A tool-use procedure in the system prompt",
    ("search", "math"),
    _find_tool_prompt,
    _build_tool_prompt,
    "more answers grounded in tool results",
)


TURN_LIMIT_PROMPT = Mechanism(
    "turn_limit_prompt",
    "prompts",
    "State the turn limit in the prompt",
    (),
    _find_turn_prompt,
    _build_turn_prompt,
    "fewer episodes ending on the turn cap",
)


BREVITY_PROMPT = Mechanism(
    "brevity_prompt",
    "prompts",
    "Ask for short replies that end with the tag",
    (),
    _find_brevity,
    _build_brevity,
    "fewer replies cut by the token cap",
)
