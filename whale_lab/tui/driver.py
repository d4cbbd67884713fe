"""The terminal driver that measures the terminal it draws on.

Textual's Linux driver sizes the screen with `shutil.get_terminal_size()`, which asks fd 1 (or
`COLUMNS`/`LINES`). `TerminalGuard` points fd 1 at the run's output log while the app runs, so
that measurement fails, falls back to 80x24 and never follows a resize. This driver asks the
descriptor it writes to (the guard's private copy of the terminal) and then stdin, and only
falls back to Textual's own rule where neither is a terminal.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def measure(*files: Any) -> tuple[int, int] | None:
    """(columns, lines) of the first of `files` that is a terminal with a size, else None."""
    for f in files:
        try:
            size = os.get_terminal_size(f.fileno())
        except (AttributeError, OSError, ValueError):
            continue
        if size.columns > 0 and size.lines > 0:
            return size.columns, size.lines
    return None


def measured_driver(base: type[Any]) -> type[Any]:
    """`base` with its size read from the terminal it draws on (Linux driver only)."""
    if os.name != "posix":
        return base
    from textual.drivers.linux_driver import LinuxDriver

    if base is not LinuxDriver:
        return base  # a driver chosen by the environment (web, headless) is left as it is
    return TerminalSizedDriver


if os.name == "posix":
    from textual.drivers.linux_driver import LinuxDriver as _LinuxDriver

    class TerminalSizedDriver(_LinuxDriver):
        """Textual's Linux driver, sized from its own output and input terminals."""

        def _get_terminal_size(self) -> tuple[int, int]:
            size = measure(self._file, sys.__stdin__)
            return size if size is not None else super()._get_terminal_size()
