"""Keep libraries that write straight to the terminal from corrupting the TUI's screen.

Textual draws through `sys.__stderr__`. Progress bars (tqdm in transformers), logging handlers
created before the app started and child processes (vLLM workers) write to file descriptors 1
and 2 directly. `TerminalGuard` moves those descriptors onto a log file for as long as the app
runs and gives Textual a private duplicate of the terminal (`whale_lab.quiet` turns the noisiest
progress output off at the source). Nothing here imports textual.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any


class TerminalGuard:
    """Redirect fds 1 and 2 to `log_path` and hand Textual a private copy of the terminal.

    Use as a context manager around `App.run`. `terminal()` gives the real terminal back to a
    child that needs it (an editor started from the app) for the duration of a `with` block.
    A no-op where fd 2 is not a terminal (tests, pipes) or on Windows.
    """

    def __init__(self, log_path: str | Path) -> None:
        self.log_path = Path(log_path)
        self.active = False
        self._saved: dict[int, int] = {}
        self._term_fd: int | None = None
        self._term_file: IO[str] | None = None
        self._log_fd: int | None = None
        self._old_dunder_stderr: Any = None

    def __enter__(self) -> TerminalGuard:
        if os.name != "posix" or not _isatty(2):
            return self
        with contextlib.suppress(OSError):
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        try:
            self._log_fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:  # a read-only run folder: drop the noise instead
            self._log_fd = os.open(os.devnull, os.O_WRONLY)
        self._saved = {1: os.dup(1), 2: os.dup(2)}
        self._term_fd = os.dup(2)
        self._term_file = os.fdopen(
            self._term_fd, "w", encoding="utf-8", errors="replace", closefd=True
        )
        self._old_dunder_stderr = sys.__stderr__
        os.dup2(self._log_fd, 1)
        os.dup2(self._log_fd, 2)
        sys.__stderr__ = self._term_file  # Textual's driver writes here
        self.active = True
        return self

    def move_log(self, log_path: str | Path) -> None:
        """Send the output to `log_path` from now on, with what the old log holds so far.

        A new run's folder exists only once the engine has made it; until then the output
        goes to a log beside it, which is moved into the folder here.
        """
        new = Path(log_path)
        if not self.active or new == self.log_path:
            self.log_path = new
            return
        try:
            new.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            return  # keep writing where we were
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(OSError):
            os.write(fd, self.log_path.read_bytes())
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        if self._log_fd is not None:
            os.close(self._log_fd)
        self._log_fd = fd
        with contextlib.suppress(OSError):
            self.log_path.unlink()
        self.log_path = new

    def __exit__(self, *exc: object) -> None:
        if not self.active:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        for fd, saved in self._saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        sys.__stderr__ = self._old_dunder_stderr
        if self._term_file is not None:
            with contextlib.suppress(Exception):
                self._term_file.close()
        if self._log_fd is not None:
            os.close(self._log_fd)
        self._saved = {}
        self.active = False

    @contextlib.contextmanager
    def terminal(self) -> Iterator[None]:
        """Point fds 1 and 2 back at the terminal for the block (e.g. while $EDITOR runs)."""
        if not self.active:
            yield
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(self._saved[1], 1)
        os.dup2(self._saved[2], 2)
        try:
            yield
        finally:
            assert self._log_fd is not None
            os.dup2(self._log_fd, 1)
            os.dup2(self._log_fd, 2)


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


class CallbackLogHandler(logging.Handler):
    """Forward log records (from any thread) to a callback, e.g. the app's event inbox."""

    def __init__(self, callback: Callable[[str, str], None], level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            level = "error" if record.levelno >= logging.ERROR else "warning"
            if record.levelno < logging.WARNING:
                level = "info"
            self.callback(level, f"{record.name}: {msg}")
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)
