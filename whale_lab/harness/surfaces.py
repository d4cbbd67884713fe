"""The harness surfaces: every attribute a harness file may define, with the default it falls back to.

Each surface has a default so that a harness can be a dozen lines and a proposer can change exactly
one mechanism. The default functions here run inside the harness host, next to the harness code,
so they use nothing but the standard library.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Imports a harness file may use (the WHALE chess contract is stricter; see chess_contract.py).
ALLOWED_IMPORTS: frozenset[str] = frozenset(
    {
        "__future__",
        "collections",
        "dataclasses",
        "functools",
        "itertools",
        "json",
        "math",
        "random",
        "re",
        "statistics",
        "string",
        "textwrap",
        "typing",
    }
)

DEFAULT_SYSTEM_PROMPT = ""
DEFAULT_USER_PROMPT = "{question}\n{observation}"
DEFAULT_MAX_TURNS = 4
DEFAULT_FORMAT_RETRY_BUDGET = 1
DEFAULT_ILLEGAL_MOVE_RETRY_BUDGET = 1
DEFAULT_STOP_SEQUENCES: tuple[str, ...] = ()

# Upper bounds that keep one harness from running away with the budget of a whole run.
MAX_TURNS_LIMIT = 100
RETRY_BUDGET_LIMIT = 100
STOP_SEQUENCES_LIMIT = 16

ROLES = ("system", "user", "assistant", "tool")


def default_format_observation(observation: Any, **context: Any) -> str:
    """Show a tool result or board: text as is, structures as readable indented text."""
    if observation is None:
        return ""
    if isinstance(observation, str):
        return observation
    return readable(observation)


def default_parse_action(response: str, **context: Any) -> str:
    """The whole reply, stripped, is the final answer."""
    return response.strip()


def default_format_feedback(kind: str, detail: str, **context: Any) -> str:
    """The environment's own explanation of what was wrong."""
    return detail


def default_select_context(messages: list[dict[str, str]], **context: Any) -> list[dict[str, str]]:
    """Every earlier message stays visible."""
    return messages


def readable(value: Any, indent: int = 0) -> str:
    """Plain text for JSON-like data: `key: value` lines and `- item` lists, nested by indent."""
    pad = "  " * indent
    if isinstance(value, Mapping):
        if not value:
            return pad + "(empty)"
        lines = []
        for key, item in value.items():
            if _is_scalar(item):
                lines.append(f"{pad}{key}: {_scalar(item)}")
            else:
                lines.append(f"{pad}{key}:")
                lines.append(readable(item, indent + 1))
        return "\n".join(lines)
    if isinstance(value, (list, tuple)):
        if not value:
            return pad + "(none)"
        lines = []
        for item in value:
            if _is_scalar(item):
                lines.append(f"{pad}- {_scalar(item)}")
            else:
                lines.append(f"{pad}-")
                lines.append(readable(item, indent + 1))
        return "\n".join(lines)
    return pad + _scalar(value)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value) if isinstance(value, float) else str(value)


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill_template(template: str, values: Mapping[str, Any]) -> str:
    """`str.format_map` over plain names only; unknown or complex placeholders stay as written.

    `{name}`, `{name!r}` and `{name:>8}` are filled when `name` is known; `{{`/`}}` are escapes.
    Attribute and index lookups (`{x.attr}`, `{x[0]}`) are never evaluated, so a template cannot
    reach into objects. A template with unbalanced braces falls back to replacing `{name}` only.
    """
    import string

    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        return _PLACEHOLDER.sub(
            lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), template
        )
    out: list[str] = []
    for literal, name, spec, conversion in parts:
        out.append(literal)
        if name is None:
            continue
        if name.isidentifier() and name in values:
            value = values[name]
            if conversion == "r":
                value = repr(value)
            elif conversion == "a":
                value = ascii(value)
            elif conversion == "s":
                value = str(value)
            try:
                out.append(format(value, spec or ""))
                continue
            except (ValueError, TypeError):
                pass
        written = "{" + name + (f"!{conversion}" if conversion else "")
        written += (f":{spec}" if spec else "") + "}"
        out.append(written)
    return "".join(out)


@dataclass(frozen=True)
class Surface:
    """One attribute of the harness contract."""

    name: str
    kind: str  # "str" | "int" | "str_tuple" | "function"
    default: Any
    meaning: str


SURFACES: dict[str, Surface] = {
    s.name: s
    for s in (
        Surface("SYSTEM_PROMPT", "str", DEFAULT_SYSTEM_PROMPT, "system message; empty: none"),
        Surface(
            "USER_PROMPT",
            "str",
            DEFAULT_USER_PROMPT,
            "first user message: a template over the task's fields plus {observation}",
        ),
        Surface("MAX_TURNS", "int", DEFAULT_MAX_TURNS, "model generations per episode"),
        Surface(
            "FORMAT_RETRY_BUDGET",
            "int",
            DEFAULT_FORMAT_RETRY_BUDGET,
            "unparseable replies tolerated",
        ),
        Surface(
            "ILLEGAL_MOVE_RETRY_BUDGET",
            "int",
            DEFAULT_ILLEGAL_MOVE_RETRY_BUDGET,
            "illegal moves tolerated (chess)",
        ),
        Surface("STOP_SEQUENCES", "str_tuple", DEFAULT_STOP_SEQUENCES, "passed to the backend"),
        Surface(
            "format_observation",
            "function",
            default_format_observation,
            "how a tool result or board is shown",
        ),
        Surface("parse_action", "function", default_parse_action, "reply -> str | dict | None"),
        Surface(
            "format_feedback",
            "function",
            default_format_feedback,
            "what the model is told after invalid or illegal output",
        ),
        Surface(
            "select_context",
            "function",
            default_select_context,
            "which earlier messages the model sees",
        ),
    )
}

# How many leading positional arguments each function surface is called with.
POSITIONAL_ARGS: dict[str, tuple[str, ...]] = {
    "format_observation": ("observation",),
    "parse_action": ("response",),
    "format_feedback": ("kind", "detail"),
    "select_context": ("messages",),
}


def surface_defaults() -> dict[str, Any]:
    """Every surface name mapped to its default value."""
    return {name: s.default for name, s in SURFACES.items()}
