"""One `ast.parse` at a time, on the Pythons whose AST constructor is not thread-safe.

CPython before 3.11.8 (and 3.12 before 3.12.2; 3.10 is treated the same) counts the AST
constructor's recursion depth in interpreter-wide state (python/cpython#106905). When the garbage collector runs Python code in
the middle of a parse, another thread may parse too, and one of the two fails with
`SystemError: AST constructor recursion depth mismatch`. whale-lab parses in several threads of
one process: the engine's worker reads harness code while the app's thread parses a key
binding's action (`ast.literal_eval`) and any thread may format a traceback (which parses the
failing line). A lost race stopped a run with that error, so on those Pythons every
`ast.parse` in the process (and so `ast.literal_eval`, which calls it) takes one lock.

Standard library only, and installed when the package is imported, before any thread starts.
"""

from __future__ import annotations

import ast
import sys
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.RLock()  # re-entrant: a collector callback may itself parse in the same thread
_MARK = "__whale_lab_serialised__"


def affected(version: tuple[int, int, int] | None = None) -> bool:
    """Whether this Python shares the AST constructor's depth counter between threads."""
    major, minor, micro = version or tuple(sys.version_info[:3])  # type: ignore[misc]
    if (major, minor) == (3, 10):
        return True  # not known to be fixed there; the lock is cheap
    if (major, minor) == (3, 11):
        return micro < 8
    if (major, minor) == (3, 12):
        return micro < 2
    return False


def serialised(parse: Callable[..., Any]) -> Callable[..., Any]:
    """`parse` behind the process-wide lock."""

    def parse_one_at_a_time(*args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return parse(*args, **kwargs)

    parse_one_at_a_time.__doc__ = parse.__doc__
    parse_one_at_a_time.__name__ = getattr(parse, "__name__", "parse")
    parse_one_at_a_time.__wrapped__ = parse  # type: ignore[attr-defined]
    setattr(parse_one_at_a_time, _MARK, True)
    return parse_one_at_a_time


def installed() -> bool:
    return bool(getattr(ast.parse, _MARK, False))


def install() -> bool:
    """Serialise `ast.parse` where this Python needs it; idempotent.

    Returns whether the lock is in place afterwards.
    """
    if installed():
        return True
    if not affected():
        return False
    ast.parse = serialised(ast.parse)  # type: ignore[assignment]
    return True
