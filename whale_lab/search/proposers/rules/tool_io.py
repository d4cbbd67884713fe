"""Evidence and tool I/O rules: how tool results and tool errors are shown to the model.

Each wraps the parent's `format_observation` (the evidence rule may also widen the search call
in `parse_action`), so results the rule does not touch are shown as before.

A tool result is shown on the turn after the call, so these rules need turns to act: more
evidence needs 2 (the search, then a turn that reads it), readable tool errors 3 (the failed call,
the retry, then a turn that reads the retry's result), a second search 3. The first two are not
proposed below that; the second-search rule raises MAX_TURNS to 3 in the same edit, since the
extra lookup is its idea.
"""

from __future__ import annotations

from whale_lab.search.codeedit import append_block, set_constant, wrap_function
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    parent_limit,
    quote,
    short,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

_READ_RESULT_TURNS = 2  # the call, then a turn that reads its result
_RETRY_CALL_TURNS = 3  # the failed call, the retry, then a turn that reads the retry's result
_SEARCH_AGAIN_TURNS = 3  # a search, a second search, then a turn that reads it and answers


def _find_more_evidence(ctx: RuleContext) -> Finding | None:
    if too_few_turns(ctx, _READ_RESULT_TURNS):
        return None  # no search result is ever shown to the model
    st = ctx.stats
    asked = max(st.tool_topk) if st.tool_topk else None
    narrow = asked is not None and asked < 3
    # With a narrow topk, every failed episode is one that more passages could have helped.
    starved = [t for t in dict.fromkeys(st.wrong_eps + st.turn_cap_eps) if narrow]
    affected = list(dict.fromkeys(st.recall_wrong_eps + st.truncated_obs + starved))
    if not st.truncated_obs and not starved:
        return None
    lengths = sorted(st.passage_lengths) or [400]
    p90 = lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))]
    chars = max(200, min(600, p90 + 20))
    per = max(st.passages_per_obs or [1])
    shown = min(5, max(per, 3))
    parts = []
    if st.truncated_obs:
        parts.append(
            f"{len(set(st.truncated_obs))} of {st.episodes} episodes saw cut evidence: of "
            f"{st.passages_seen} retrieved passages in {st.observations} tool results, "
            f"{st.passages_truncated} were cut short and {st.passages_hidden} were not shown at "
            f"all (longest passage {lengths[-1]} chars)"
        )
    if narrow:
        parts.append(
            f"the parser asks the tool for only topk={asked} passage(s) per search, and "
            f"{len(starved)} episodes ended wrong or on the turn cap"
        )
    if st.recall_wrong_eps:
        parts.append(
            f"in {len(st.recall_wrong_eps)} wrong episodes a retrieved passage did hold the answer"
        )
    return Finding(
        count=len(affected),
        total=st.episodes,
        cited=tuple(cite(affected)),
        evidence="; ".join(parts) + ".",
        params={"chars": chars, "passages": shown, "raise_topk": narrow},
    )


_PASSAGE_HELPER = '''\
def _passage_items(observation):
    """(title, text) pairs from a tool result: a string, a list, or a dict holding a list."""
    if isinstance(observation, str):
        return [("", observation)] if observation.strip() else []
    if isinstance(observation, dict):
        for key in ("passages", "results", "documents", "docs", "hits", "items", "contexts"):
            if isinstance(observation.get(key), list):
                return _passage_items(observation[key])
        for key in ("text", "content", "contents", "passage", "output", "stdout", "result"):
            if isinstance(observation.get(key), str):
                return _passage_items(observation[key])
        return []
    items = []
    if isinstance(observation, (list, tuple)):
        for item in observation:
            if isinstance(item, str) and item.strip():
                items.append(("", item))
            elif isinstance(item, dict):
                title = item.get("title") or ""
                text = ""
                for key in ("text", "content", "contents", "passage"):
                    if isinstance(item.get(key), str):
                        text = item[key]
                        break
                if text or title:
                    items.append((str(title), str(text)))
    return items
'''


def _build_more_evidence(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "short", ["observation"])
    body = (
        f"_PASSAGES_SHOWN = {f.params['passages']}\n"
        f"_PASSAGE_CHARS = {f.params['chars']}\n\n\n" + _PASSAGE_HELPER + "\n\n"
        "def format_observation(observation, **context):\n"
        '    """Tool results: several passages, numbered, each cut at a sentence-sized limit."""\n'
        "    items = _passage_items(observation) if observation is not None else []\n"
        "    if not items:\n"
        f"        return {prev}\n"
        "    if len(items) == 1 and not items[0][0]:\n"
        "        text, limit = str(items[0][1]).strip(), _PASSAGE_CHARS * _PASSAGES_SHOWN\n"
        '        return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."\n'
        "    lines = []\n"
        "    for i, (title, text) in enumerate(items[:_PASSAGES_SHOWN], 1):\n"
        '        text = " ".join(str(text).split())\n'
        "        if len(text) > _PASSAGE_CHARS:\n"
        '            text = text[:_PASSAGE_CHARS].rsplit(" ", 1)[0] + " ..."\n'
        '        lines.append(f"[{i}] {title}: {text}" if title else f"[{i}] {text}")\n'
        '    return "\\n".join(lines)\n'
    )
    code = append_block(code, body)
    change = (
        f"format_observation now shows up to {f.params['passages']} passages, numbered with "
        f"their titles, each up to {f.params['chars']} characters, instead of the parent's "
        "cut view"
    )
    if f.params.get("raise_topk"):
        code, pprev = wrap_function(code, "parse_action", "narrow", ["response"])
        code = append_block(
            code,
            (
                "def parse_action(response, **context):\n"
                '    """The parent\'s parser; a search asks for as many passages as are shown."""\n'
                f"    result = {pprev}\n"
                '    if isinstance(result, dict) and result.get("type") == "tool":\n'
                '        args = result.get("arguments")\n'
                '        if isinstance(args, dict) and isinstance(args.get("topk"), int) \\\n'
                '                and args["topk"] < _PASSAGES_SHOWN:\n'
                "            result = dict(result, arguments=dict(args, topk=_PASSAGES_SHOWN))\n"
                "    return result\n"
            ),
        )
        change += (
            f"; the search call asks for {f.params['passages']} passages instead of the "
            "parent's fixed smaller topk, so there is something more to show"
        )
    return code, change + "."


def _find_search_again(ctx: RuleContext) -> Finding | None:
    if ctx.domain != "search" or not ctx.spec.tool:
        return None
    eps = ctx.stats.wrong_few_tools_eps
    if not eps:
        return None
    turns = parent_limit(ctx.parent_code, "MAX_TURNS")
    short_of_turns = turns is not None and turns < _SEARCH_AGAIN_TURNS
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes answered wrongly after at most one "
        f"search (mean {ctx.stats.tool_calls_total / max(1, ctx.stats.episodes):.1f} tool calls "
        "per episode); two-hop questions need a second lookup"
        + (f", and MAX_TURNS={turns} leaves no turn for one." if short_of_turns else ".")
    )
    return Finding(
        count=len(eps),
        total=ctx.stats.episodes,
        cited=tuple(cite(eps)),
        evidence=ev,
        params={"turns": turns, "raise_turns": short_of_turns},
    )


def _build_search_again(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "bare", ["observation"])
    hint = (
        f"If these passages do not state the answer, search again for the entity they "
        f"point to with {ctx.spec.tool_form}; otherwise answer with {ctx.spec.answer_form}."
    )
    body = (
        f"_SEARCH_AGAIN_HINT = {quote(hint)}\n\n\n"
        "def format_observation(observation, **context):\n"
        '    """After a tool result, remind the model that a second lookup is allowed."""\n'
        f"    text = {prev}\n"
        '    turn, cap = context.get("turn_count"), context.get("max_turns")\n'
        "    if observation is None or not str(text).strip() or turn == 1:\n"
        "        return text\n"
        "    if isinstance(turn, int) and isinstance(cap, int) and turn >= cap:\n"
        "        return text\n"
        '    return str(text).rstrip() + "\\n\\n" + _SEARCH_AGAIN_HINT\n'
    )
    code = append_block(code, body)
    change = (
        "format_observation appends, after each search result, a rule to search again for the "
        "bridging entity when the passages do not state the answer (not on the last turn)"
    )
    if f.params.get("raise_turns"):
        # Below 3 turns the hint is never shown (turn 1 has no result, the last turn no hint).
        code = set_constant(code, "MAX_TURNS", _SEARCH_AGAIN_TURNS)
        change += (
            f"; MAX_TURNS goes {f.params['turns']} -> {_SEARCH_AGAIN_TURNS}, so there is a turn "
            "for the second search and one to answer from its result (with "
            f"{f.params['turns']} turns the hint could never be shown)"
        )
    return code, change + "."


def _find_tool_error_view(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.tool_error_eps
    if not eps or not ctx.spec.tool:
        return None
    if too_few_turns(ctx, _RETRY_CALL_TURNS):
        return None  # a fixed call's result would never be read before the turn cap
    details = [d for d in ctx.stats.tool_error_details if d.strip()]
    sample = short(details[0].strip().splitlines()[-1]) if details else ""
    ev = (
        f"{len(ctx.stats.tool_error_details)} tool calls failed in {len(eps)} of "
        f"{ctx.stats.episodes} episodes"
        + (f"; e.g. {sample!r}" if sample else "")
        + "; the failure is shown as a raw record, with no hint how to recover."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_tool_error_view(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "raw", ["observation"])
    tool = ctx.spec.tool or ("tool", "input")
    tag = ctx.spec.tool_tag or tool[0]
    if tool[1] == "code":
        hint = (
            f"Fix the code and call the tool again; it must print its result, for example "
            f"<{tag}>print(12 * 7)</{tag}>."
        )
    else:
        hint = (
            f"Call the tool again with a short {tool[1]} of a few key words from the question, "
            f"for example {ctx.spec.tool_form}."
        )
    body = (
        f"_TOOL_ERROR_HINT = {quote(hint)}\n\n\n"
        "def format_observation(observation, **context):\n"
        '    """A failed tool call: the error\'s last line first, then how to call it right."""\n'
        '    if isinstance(observation, dict) and observation.get("error"):\n'
        '        lines = str(observation.get("error")).strip().splitlines() or [""]\n'
        '        out = str(observation.get("stdout") or "").strip()\n'
        '        text = "The tool call failed: " + lines[-1][:300]\n'
        "        if out:\n"
        '            text += "\\nOutput before the error:\\n" + out[:500]\n'
        '        return text + "\\n" + _TOOL_ERROR_HINT\n'
        f"    return {prev}\n"
    )
    return append_block(code, body), (
        "format_observation now shows a failed tool call as the "
        "error's last line plus a correct call form, instead of the "
        "raw record; successful results are shown as before."
    )


MORE_EVIDENCE = Mechanism(
    "more_evidence",
    "tool_io",
    "Show more and longer retrieved passages",
    ("search",),
    _find_more_evidence,
    _build_more_evidence,
    "answers that were cut from the passages become visible, raising success",
)


SEARCH_AGAIN_RULE = Mechanism(
    "search_again_rule",
    "tool_io",
    "Prompt a second search when passages fall short",
    ("search",),
    _find_search_again,
    _build_search_again,
    "two-hop questions get their second lookup before the answer",
)


TOOL_ERROR_VIEW = Mechanism(
    "tool_error_view",
    "tool_io",
    "Readable tool errors with a correct call form",
    ("search", "math"),
    _find_tool_error_view,
    _build_tool_error_view,
    "failed tool calls get fixed on the next turn",
)
