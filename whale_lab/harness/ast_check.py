"""Static check of harness code before it runs: syntax, import allow-list, forbidden names.

Harness files are often written by an LLM. This check gives a readable reason (line and what is
wrong) for the usual ways out of the sandbox: imports outside the allow-list, `eval`/`exec`/`open`,
dunder attributes such as `__subclasses__` or `__globals__` (also inside `str.format` fields of
string constants), frame and code objects, and the few library helpers that evaluate strings as
code. It is a fast first filter, not the boundary: the host also runs the module with restricted
builtins, a guarded `__import__` and filtered module views, inside a process with resource limits
that the operating system confines where it can (`whale_lab.confine`).
"""

from __future__ import annotations

import _string  # the parser str.format itself uses for field names
import ast
import string
import warnings
from collections.abc import Iterable
from dataclasses import dataclass

from whale_lab.harness.surfaces import ALLOWED_IMPORTS

MAX_SOURCE_CHARS = 200_000

# Builtins a harness may not name at all (the runtime does not provide them either).
FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        "eval",
        "exec",
        "compile",
        "open",
        "__import__",
        "globals",
        "locals",
        "vars",
        "breakpoint",
        "memoryview",
    }
)

# Dunder names a harness may use as bare names or attributes; every other dunder is refused.
SAFE_DUNDER_NAMES: frozenset[str] = frozenset({"__name__", "__doc__"})
SAFE_DUNDER_ATTRS: frozenset[str] = frozenset(
    {
        "__init__",
        "__post_init__",
        "__name__",
        "__qualname__",
        "__doc__",
        "__len__",
        "__iter__",
        "__next__",
        "__contains__",
        "__getitem__",
        "__setitem__",
        "__str__",
        "__repr__",
        "__format__",
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
        "__hash__",
        "__bool__",
        "__call__",
        "__enter__",
        "__exit__",
        "__add__",
    }
)

# Public attribute names that reach frames, code objects, module internals, or evaluate strings.
FORBIDDEN_ATTRS: frozenset[str] = frozenset(
    {
        "gi_frame",
        "gi_code",
        "gi_yieldfrom",
        "cr_frame",
        "cr_code",
        "cr_await",
        "ag_frame",
        "ag_code",
        "ag_await",
        "f_globals",
        "f_locals",
        "f_builtins",
        "f_back",
        "f_code",
        "f_trace",
        "tb_frame",
        "tb_next",
        "co_code",
        "func_globals",
        "func_code",
        "get_field",
        "get_type_hints",
        "ForwardRef",
        "evaluate_forward_ref",
        "singledispatch",
        "singledispatchmethod",
        "sys",
        "os",
        "builtins",
        "modules",
    }
)

ATTR_FUNCTIONS = frozenset({"getattr", "setattr", "delattr", "hasattr"})


@dataclass(frozen=True)
class AstProblem:
    """One reason the code may not run, with its line (0 when it concerns the whole file)."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}" if self.line else self.message


def attr_problem(attr: str, *, on_self: bool = False) -> str | None:
    """Why `obj.<attr>` is refused, or None when it is fine."""
    if attr in FORBIDDEN_ATTRS:
        return f"forbidden attribute '{attr}'"
    if attr.startswith("__") and attr.endswith("__"):
        if attr in SAFE_DUNDER_ATTRS:
            return None
        return f"forbidden dunder attribute '{attr}'"
    if attr.startswith("_") and not on_self:
        return f"private attribute '{attr}' (allowed only on self or cls)"
    return None


_FORMATTER = string.Formatter()


def format_field_problem(text: str, depth: int = 0) -> str | None:
    """Why a string's `str.format` fields are refused: they would reach a refused attribute.

    `"{0.__init__.__globals__}".format(obj)` (or a Formatter subclass, which receives the object
    itself) reads attributes the attribute rules refuse, from a plain string constant.
    """
    if "{" not in text or depth > 2:
        return None
    try:
        fields = list(_FORMATTER.parse(text))
    except ValueError:
        return None  # not a format string
    for _literal, name, spec, _conversion in fields:
        if name:
            try:
                _first, rest = _string.formatter_field_name_split(name)
                parts = list(rest)
            except ValueError:
                parts = []
            for is_attr, key in parts:
                problem = attr_problem(str(key)) if is_attr else None
                if problem:
                    return f"format field '{{{name}}}' uses {problem}"
        if spec:
            problem = format_field_problem(spec, depth + 1)
            if problem:
                return problem
    return None


def _name_problem(name: str) -> str | None:
    if name in FORBIDDEN_NAMES:
        return f"forbidden name '{name}'"
    if name.startswith("__") and name.endswith("__") and name not in SAFE_DUNDER_NAMES:
        return f"forbidden name '{name}'"
    return None


class _Checker(ast.NodeVisitor):
    def __init__(self, allowed_imports: Iterable[str], contract: str) -> None:
        self.allowed = frozenset(allowed_imports)
        self.contract = contract
        self.problems: list[AstProblem] = []

    def add(self, node: ast.AST, message: str) -> None:
        self.problems.append(AstProblem(getattr(node, "lineno", 0), message))

    def _check_module(self, node: ast.AST, module: str) -> None:
        root = module.split(".", 1)[0]
        if root not in self.allowed:
            allowed = ", ".join(sorted(self.allowed))
            self.add(
                node,
                f"forbidden import '{module}' ({self.contract} allows only: {allowed})",
            )

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._check_module(node, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.add(node, "relative imports are not allowed in harness code")
        else:
            self._check_module(node, node.module or "")
        for alias in node.names:
            if alias.name == "*":
                self.add(node, "'import *' is not allowed in harness code")
                continue
            problem = attr_problem(alias.name)
            if problem:
                self.add(node, f"{problem} imported from '{node.module}'")
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        problem = _name_problem(node.id)
        if problem:
            self.add(node, problem)

    def visit_Global(self, node: ast.Global) -> None:
        for name in node.names:
            problem = _name_problem(name)
            if problem:
                self.add(node, problem)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        on_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        problem = attr_problem(node.attr, on_self=on_self)
        if problem:
            self.add(node, problem)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            problem = format_field_problem(node.value)
            if problem:
                self.add(node, problem)

    def visit_MatchClass(self, node: ast.MatchClass) -> None:
        for attr in node.kwd_attrs:
            problem = attr_problem(attr)
            if problem:
                self.add(node, f"{problem} in a match pattern")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ATTR_FUNCTIONS and len(node.args) >= 2:
            name_arg = node.args[1]
            if isinstance(name_arg, ast.Constant) and isinstance(name_arg.value, str):
                problem = attr_problem(name_arg.value)
                if problem:
                    self.add(node, f"{problem} via {func.id}()")
        self.generic_visit(node)


def parse_source(source: str, filename: str = "<harness>") -> ast.Module:
    """Parse harness code; raises SyntaxError (also for code too deep or too big to parse)."""
    if len(source) > MAX_SOURCE_CHARS:
        raise SyntaxError(
            f"the file is too large ({len(source)} characters; at most {MAX_SOURCE_CHARS})"
        )
    try:
        with warnings.catch_warnings():
            # e.g. SyntaxWarning for "\d" in a plain string: not ours to print (the TUI owns stderr)
            warnings.simplefilter("ignore")
            return ast.parse(source, filename=filename)
    except (RecursionError, MemoryError):
        raise SyntaxError("the code is nested too deeply to parse") from None
    except ValueError as exc:  # e.g. null bytes
        raise SyntaxError(str(exc)) from None


def check_tree(
    tree: ast.AST,
    allowed_imports: Iterable[str] = ALLOWED_IMPORTS,
    *,
    contract: str = "the harness contract",
) -> list[AstProblem]:
    """Every problem in an already parsed module, in line order."""
    checker = _Checker(allowed_imports, contract)
    checker.visit(tree)
    seen: set[tuple[int, str]] = set()
    out = []
    for p in sorted(checker.problems, key=lambda p: p.line):
        if (p.line, p.message) not in seen:
            seen.add((p.line, p.message))
            out.append(p)
    return out


def check_source(
    source: str,
    filename: str = "<harness>",
    allowed_imports: Iterable[str] = ALLOWED_IMPORTS,
    *,
    contract: str = "the harness contract",
) -> list[AstProblem]:
    """Syntax plus static rules; an empty list means the code may be loaded."""
    try:
        tree = parse_source(source, filename)
    except SyntaxError as exc:
        line = exc.lineno or 0
        return [AstProblem(line, f"syntax error: {exc.msg}")]
    return check_tree(tree, allowed_imports, contract=contract)


def definition_lines(tree: ast.Module) -> dict[str, int]:
    """Line of the last top-level binding of each name (for messages about constants)."""
    lines: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            lines[node.name] = node.lineno
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        lines[sub.id] = node.lineno
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            if isinstance(node.target, ast.Name):
                lines[node.target.id] = node.lineno
    return lines
