"""Reading parse_action's return value for domains whose turns are a final answer or a tool call."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from whale_lab.domains.base import Action

# (tool name, its arguments as a dict) -> a tool Action, or an invalid one saying what is wrong
ToolReader = Callable[[str, Mapping[str, Any]], Action]


def normalise_answer_or_tool(raw: Any, tools: Sequence[str], read_tool: ToolReader, *,
                             domain: str, default_arg: str) -> Action:
    """str -> answer; dicts per docs/design.md; anything else -> an invalid action with a reason."""
    if raw is None:
        return Action(kind="invalid", reason="no answer or tool call found in the reply")
    if isinstance(raw, str):
        if not raw.strip():
            return Action(kind="invalid", reason="empty answer")
        return Action(kind="answer", value=raw.strip())
    if not isinstance(raw, Mapping):
        return Action(
            kind="invalid",
            reason=f"parse_action returned {type(raw).__name__}; expected str, dict or None",
        )
    kind = raw.get("type")
    if kind == "answer":
        content = raw.get("content")
        if content is None or isinstance(content, (dict, list)) or not str(content).strip():
            return Action(kind="invalid", reason="answer action without content")
        return Action(kind="answer", value=str(content).strip())
    if kind == "tool":
        name = raw.get("name")
        if name not in tools:
            return Action(
                kind="invalid",
                reason=f"unknown tool {name!r}; this domain offers: {', '.join(tools)}",
            )
        args = raw.get("arguments", {})
        if isinstance(args, str):
            args = {default_arg: args}
        if not isinstance(args, Mapping):
            return Action(kind="invalid", reason="tool arguments must be a dict")
        return read_tool(str(name), args)
    if kind == "invalid":
        return Action(kind="invalid", reason=str(raw.get("reason", "")) or "invalid reply")
    if kind == "move":
        return Action(kind="invalid", reason=f"{domain} has no moves; give an answer or a tool call")
    return Action(kind="invalid", reason=f"unknown action type {kind!r}")
