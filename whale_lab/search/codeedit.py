"""Source edits on a harness file that keep everything else byte for byte.

The rules proposer changes one surface at a time: replace a constant, or wrap a contract function
so the parent's behaviour stays and one mechanism is added on top. Edits are located with `ast`
and applied to the text, so comments and the rest of the file survive and the diff stays small.
"""

from __future__ import annotations

import ast
from typing import Any

# The contract defaults (ARCHITECTURE.md), written out for when a parent does not define a function.
DEFAULT_SOURCES = {
    "parse_action": ("def {name}(response):\n    return str(response).strip()\n"),
    "format_observation": (
        "def {name}(observation):\n"
        '    """The contract default: text as is, structures as readable indented text."""\n'
        "    def scalar(v):\n"
        "        if v is None:\n"
        '            return "null"\n'
        "        if isinstance(v, bool):\n"
        '            return "true" if v else "false"\n'
        "        return str(v)\n\n"
        "    def readable(v, indent=0):\n"
        '        pad = "  " * indent\n'
        "        plain = (str, int, float, bool, type(None))\n"
        "        if isinstance(v, dict):\n"
        "            if not v:\n"
        '                return pad + "(empty)"\n'
        "            lines = []\n"
        "            for k, item in v.items():\n"
        "                if isinstance(item, plain):\n"
        '                    lines.append(f"{{pad}}{{k}}: {{scalar(item)}}")\n'
        "                else:\n"
        '                    lines.append(f"{{pad}}{{k}}:")\n'
        "                    lines.append(readable(item, indent + 1))\n"
        '            return "\\n".join(lines)\n'
        "        if isinstance(v, (list, tuple)):\n"
        "            if not v:\n"
        '                return pad + "(none)"\n'
        "            lines = []\n"
        "            for item in v:\n"
        "                if isinstance(item, plain):\n"
        '                    lines.append(f"{{pad}}- {{scalar(item)}}")\n'
        "                else:\n"
        '                    lines.append(f"{{pad}}-")\n'
        "                    lines.append(readable(item, indent + 1))\n"
        '            return "\\n".join(lines)\n'
        "        return pad + scalar(v)\n\n"
        "    if observation is None:\n"
        '        return ""\n'
        "    if isinstance(observation, str):\n"
        "        return observation\n"
        "    return readable(observation)\n"
    ),
    "format_feedback": ("def {name}(kind, detail):\n    return str(detail)\n"),
    "select_context": ("def {name}(messages):\n    return list(messages)\n"),
}


def _tree(code: str) -> ast.Module:
    return ast.parse(code)


def find_top_level(code: str, name: str) -> ast.stmt | None:
    """The last top-level statement that binds `name` (def, class or simple assignment)."""
    found = None
    for node in _tree(code).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                found = node
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                found = node
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name) and node.target.id == name:
                found = node
    return found


def get_constant(code: str, name: str, default: Any = None) -> Any:
    """The literal value of a top-level constant, or `default` when absent or not a literal."""
    node = find_top_level(code, name)
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        try:
            return ast.literal_eval(node.value)
        except ValueError:
            return default
    return default


def _span(node: ast.stmt) -> tuple[int, int]:
    start = node.lineno
    decorators = getattr(node, "decorator_list", [])
    if decorators:
        start = min(d.lineno for d in decorators)
    return start, node.end_lineno or node.lineno


def replace_top_level(code: str, name: str, new_source: str) -> str:
    """Replace the statement binding `name` with `new_source`, or append it when absent."""
    node = find_top_level(code, name)
    new_source = new_source.rstrip("\n") + "\n"
    if node is None:
        return append_block(code, new_source)
    lines = code.splitlines(keepends=True)
    start, end = _span(node)
    return "".join(lines[: start - 1]) + new_source + "".join(lines[end:])


def set_constant(code: str, name: str, value: Any) -> str:
    return replace_top_level(code, name, f"{name} = {value!r}\n")


def append_block(code: str, block: str) -> str:
    code = code.rstrip("\n") + "\n"
    return code + "\n\n" + block.rstrip("\n") + "\n"


def ensure_import(code: str, module: str) -> str:
    """Add `import module` after the docstring and `__future__` imports unless it is there."""
    tree = _tree(code)
    for node in tree.body:
        if isinstance(node, ast.Import) and any(
            a.name == module and a.asname is None for a in node.names
        ):
            return code
    insert_after = 0
    for node in tree.body:
        is_doc = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        is_future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if is_doc or is_future:
            insert_after = node.end_lineno or node.lineno
        else:
            break
    lines = code.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return "".join(lines[:insert_after]) + f"import {module}\n" + "".join(lines[insert_after:])


def top_level_names(code: str) -> set[str]:
    from whale_lab.search.surfaces import top_level_definitions

    return set(top_level_definitions(_tree(code)))


def unique_name(code: str, base: str) -> str:
    names = top_level_names(code)
    if base not in names:
        return base
    i = 2
    while f"{base}_{i}" in names:
        i += 1
    return f"{base}_{i}"


def _call_expr(fn: ast.FunctionDef, new_name: str, positional: list[str], ctx_var: str) -> str:
    """How the wrapper calls the parent's function, passing only the keywords it accepts."""
    if fn.args.vararg is None and len(fn.args.posonlyargs + fn.args.args) < len(positional):
        positional = positional[: len(fn.args.posonlyargs + fn.args.args)]
    args = ", ".join(positional)
    if fn.args.kwarg is not None:
        return f"{new_name}({args}, **{ctx_var})" if args else f"{new_name}(**{ctx_var})"
    named = [a.arg for a in fn.args.args + fn.args.kwonlyargs][len(positional) :]
    named += [a.arg for a in fn.args.kwonlyargs if a.arg not in named]
    if not named:
        return f"{new_name}({args})"
    keep = ", ".join(repr(n) for n in dict.fromkeys(named))
    filt = f"**{{k: v for k, v in {ctx_var}.items() if k in ({keep},)}}"
    return f"{new_name}({args}, {filt})" if args else f"{new_name}({filt})"


def wrap_function(code: str, name: str, tag: str, positional: list[str]) -> tuple[str, str]:
    """Keep the parent's `name` under a new name and return (code, call expression for it).

    The caller appends a new `def name(...)` that uses the call expression (with `context` as the
    keyword dict). When the parent has no `name`, the contract default is added under the new name.
    """
    new_name = unique_name(code, f"_{name}_{tag}")
    node = find_top_level(code, name)
    if isinstance(node, ast.FunctionDef):
        lines = code.splitlines(keepends=True)
        i = node.lineno - 1
        lines[i] = lines[i].replace(f"def {name}", f"def {new_name}", 1)
        code = "".join(lines)
        return code, _call_expr(node, new_name, positional, "context")
    if node is not None:
        raise ValueError(f"{name} is bound by a non-function statement at line {node.lineno}")
    default = DEFAULT_SOURCES[name].format(name=new_name)
    code = append_block(code, default)
    return code, f"{new_name}({', '.join(positional)})"


def string_constant(code: str, name: str) -> str:
    v = get_constant(code, name, "")
    return v if isinstance(v, str) else ""


def check_syntax(code: str) -> None:
    """Raise SyntaxError early for a generated file (a bug here, not the model's)."""
    compile(code, "<candidate>", "exec")
