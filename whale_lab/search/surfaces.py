"""Which harness surfaces a change touches, read from the code (not from the proposer's claim).

Surfaces are the named attributes of the harness contract; helpers count for the surface of the
contract function that uses them. The reviewer and the archive show this so that "one mechanism per
candidate" can be checked at a glance.
"""

from __future__ import annotations

import ast

SURFACE_OF_NAME = {
    "SYSTEM_PROMPT": "prompts",
    "USER_PROMPT": "prompts",
    "format_observation": "tool_io",
    "parse_action": "parser",
    "format_feedback": "feedback",
    "FORMAT_RETRY_BUDGET": "feedback",
    "ILLEGAL_MOVE_RETRY_BUDGET": "feedback",
    "select_context": "context",
    "MAX_TURNS": "termination",
    "STOP_SEQUENCES": "termination",
    # the WHALE chess contract
    "propose_action": "parser",
    "is_legal_action": "parser",
}


def top_level_definitions(tree: ast.Module) -> dict[str, ast.stmt]:
    """Top-level names bound by def/class/assignment -> the (last) statement binding them."""
    out: dict[str, ast.stmt] = {}
    for node in tree.body:
        for name in bound_names(node):
            out[name] = node
    return out


def bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=True, include_attributes=False)


def changed_names(parent_code: str, code: str) -> list[str]:
    """Top-level names whose definition differs (added, removed or changed), in file order."""
    try:
        old = top_level_definitions(ast.parse(parent_code)) if parent_code else {}
        new = top_level_definitions(ast.parse(code))
    except SyntaxError:
        return []
    names = []
    for name in list(new) + [n for n in old if n not in new]:
        a, b = old.get(name), new.get(name)
        if a is None or b is None or _dump(a) != _dump(b):
            names.append(name)
    return names


def _users(tree: ast.Module) -> dict[str, set[str]]:
    """helper name -> contract names whose definition mentions it (directly or through helpers)."""
    defs = top_level_definitions(tree)
    mentions = {
        name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        for name, node in defs.items()
    }
    users: dict[str, set[str]] = {}
    for contract in SURFACE_OF_NAME:
        seen: set[str] = set()
        stack = [contract]
        while stack:
            cur = stack.pop()
            for m in mentions.get(cur, ()):
                if m not in seen and m in defs:
                    seen.add(m)
                    stack.append(m)
        for m in seen:
            users.setdefault(m, set()).add(contract)
    return users


def changed_surfaces(parent_code: str, code: str) -> list[str]:
    """The surfaces a candidate changes relative to its parent, in a stable order."""
    names = changed_names(parent_code, code)
    try:
        users = _users(ast.parse(code))
    except SyntaxError:
        return []
    out: list[str] = []
    for name in names:
        if name in SURFACE_OF_NAME:
            found = [SURFACE_OF_NAME[name]]
        else:
            found = sorted({SURFACE_OF_NAME[u] for u in users.get(name, ())})
        for s in found:
            if s not in out:
                out.append(s)
    return out
