"""The AST constructor's thread race (python/cpython#106905) and the lock that avoids it."""

from __future__ import annotations

import ast
import gc
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from whale_lab import ast_guard

SOURCE = "\n".join(
    f"def f{i}(a, b):\n    return [[x + {i} for x in range(a) if x % b] for _ in (1, 2)]"
    for i in range(300)
)
RAW_PARSE: Callable[..., Any] = getattr(ast.parse, "__wrapped__", ast.parse)


@pytest.fixture
def collector_switches_threads() -> Iterator[dict[str, Any]]:
    """A collector callback that, the first time it runs in thread "a", lets thread "b" parse.

    This is what the garbage collector can do in the middle of `ast.parse` in a threaded
    program (any Python code it runs may hand the GIL over); here it happens every time.
    """
    state: dict[str, Any] = {"go_b": threading.Event(), "b_done": threading.Event(), "runs": 0}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and threading.current_thread().name == "a":
            state["runs"] += 1
            # thousands of collections run while "a" builds the tree: well inside it by now
            if state["runs"] == 1000:
                state["go_b"].set()
                state["b_done"].wait(0.5)  # with the lock, "b" waits for "a" instead

    old = gc.get_threshold()
    gc.callbacks.append(callback)
    gc.set_threshold(1, 1, 1)
    try:
        yield state
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(callback)


def _race(parse: Callable[..., Any], state: dict[str, Any]) -> list[str]:
    errors: list[str] = []

    def a() -> None:
        try:
            parse(SOURCE)
        except SystemError as exc:
            errors.append(f"a: {exc}")

    def b() -> None:
        state["go_b"].wait(5)
        try:
            parse(SOURCE)
        except SystemError as exc:
            errors.append(f"b: {exc}")
        finally:
            state["b_done"].set()

    threads = [threading.Thread(target=a, name="a"), threading.Thread(target=b, name="b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert state["go_b"].is_set(), "the collector never ran during the parse"
    return errors


def test_serialised_parses_in_two_threads_both_succeed(
    collector_switches_threads: dict[str, Any],
) -> None:
    assert _race(ast_guard.serialised(RAW_PARSE), collector_switches_threads) == []


@pytest.mark.skipif(not ast_guard.affected(), reason="this Python's AST constructor is fixed")
def test_without_the_lock_this_python_loses_the_race(
    collector_switches_threads: dict[str, Any],
) -> None:
    """The race is real here: the lock above is what stops it, not luck."""
    errors = _race(RAW_PARSE, collector_switches_threads)
    assert errors and "recursion depth mismatch" in errors[0]


def test_importing_the_package_installs_the_lock_where_needed() -> None:
    assert ast_guard.installed() == ast_guard.affected()
    if ast_guard.installed():
        assert ast.literal_eval("(1, 'two')") == (1, "two")  # literal_eval goes through it too


@pytest.mark.parametrize(
    ("version", "needs_lock"),
    [
        ((3, 10, 13), True),
        ((3, 11, 7), True),
        ((3, 11, 8), False),
        ((3, 12, 1), True),
        ((3, 12, 2), False),
        ((3, 13, 0), False),
    ],
)
def test_which_pythons_need_the_lock(version: tuple[int, int, int], needs_lock: bool) -> None:
    assert ast_guard.affected(version) is needs_lock
