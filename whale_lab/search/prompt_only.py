"""The prompt-only check (the paper's FST control): only the prompt text may differ from h0.

A candidate is compared with the phase's starting harness (its h0), not with its parent, so a chain
of small edits cannot drift away from it. Both files are parsed; top-level assignments of
`SYSTEM_PROMPT` and `USER_PROMPT` to string constants are blanked, docstrings are masked, and every
annotated assignment is compared as a plain one (annotations never change behaviour here); the
rest must be the same AST. Comments and formatting do not count.
"""

from __future__ import annotations

import ast

PROMPT_CONSTANTS = ("SYSTEM_PROMPT", "USER_PROMPT")


class _Blank(ast.NodeTransformer):
    """Replace prompt assignments' values by a marker; collect a problem when one is not a string."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            node.body = _without_docstring(node.body) or [ast.Pass()]
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        node = self.generic_visit(node)  # type: ignore[assignment]
        if node.value is None:  # a bare annotation binds nothing
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)

    def visit_Module(self, node: ast.Module) -> ast.Module:
        node.body = _without_docstring(node.body)
        body = []
        for stmt in node.body:
            name, value = _prompt_assignment(stmt)
            if name is None:
                body.append(stmt)
                continue
            if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
                self.problems.append(
                    f"{name} (line {stmt.lineno}) must be a plain string constant in prompt-only mode"
                )
                body.append(stmt)
                continue
            # A prompt may be added, changed or removed: drop the assignment from the comparison.
        node.body = [self.visit(stmt) for stmt in body]
        return node


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        return body[1:]
    return body


def _prompt_assignment(stmt: ast.stmt) -> tuple[str | None, ast.expr | None]:
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        t = stmt.targets[0]
        if isinstance(t, ast.Name) and t.id in PROMPT_CONSTANTS:
            return t.id, stmt.value
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        if stmt.target.id in PROMPT_CONSTANTS:
            return stmt.target.id, stmt.value
    return None, None


def _describe(stmt: ast.stmt) -> str:
    from whale_lab.search.surfaces import bound_names

    names = bound_names(stmt)
    what = f"`{names[0]}`" if names else type(stmt).__name__.lower()
    return f"{what} (line {stmt.lineno})"


def prompt_only_violation(parent_code: str, code: str) -> str | None:
    """None when only SYSTEM_PROMPT / USER_PROMPT text differs from `parent_code` (the phase's h0);
    otherwise a readable reason."""
    try:
        old = ast.parse(parent_code)
    except SyntaxError as exc:
        return f"h0 does not parse (line {exc.lineno}): {exc.msg}"
    try:
        new = ast.parse(code)
    except SyntaxError as exc:
        return f"the candidate does not parse (line {exc.lineno}): {exc.msg}"
    blank_old, blank_new = _Blank(), _Blank()
    old = blank_old.visit(old)
    new = blank_new.visit(new)
    if blank_new.problems:
        return "prompt-only mode: " + "; ".join(blank_new.problems)
    a = [ast.dump(s) for s in old.body]
    b = [ast.dump(s) for s in new.body]
    if a == b:
        return None
    # Name the first statement that differs, from the candidate's side when it has one.
    for i in range(max(len(a), len(b))):
        if i >= len(a):
            return (
                f"prompt-only mode: {_describe(new.body[i])} was added; only "
                f"{' and '.join(PROMPT_CONSTANTS)} may change"
            )
        if i >= len(b):
            return (
                f"prompt-only mode: {_describe(old.body[i])} of h0 was removed; only "
                f"{' and '.join(PROMPT_CONSTANTS)} may change"
            )
        if a[i] != b[i]:
            return (
                f"prompt-only mode: {_describe(new.body[i])} differs from h0; only "
                f"{' and '.join(PROMPT_CONSTANTS)} may change"
            )
    return "prompt-only mode: the code differs from h0 outside the prompt constants"
