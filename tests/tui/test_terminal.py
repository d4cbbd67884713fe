"""TerminalGuard: writes to fds 1/2 (progress bars, child processes) go to a log, not the screen."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from whale_lab.tui.terminal import CallbackLogHandler, TerminalGuard

SCRIPT = textwrap.dedent(
    """
    import os, subprocess, sys
    from whale_lab.tui.terminal import TerminalGuard

    with TerminalGuard(sys.argv[1]) as guard:
        assert guard.active
        os.write(1, b"stdout-noise\\n")
        os.write(2, b"stderr-noise\\n")
        print("print-noise", flush=True)
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('child-noise\\\\n')"])
        sys.__stderr__.write("drawn-by-the-app\\n")
        sys.__stderr__.flush()
        with guard.terminal():
            os.write(2, b"editor-output\\n")
        os.write(2, b"more-noise\\n")
    os.write(2, b"after-exit\\n")
    """
)


@pytest.mark.skipif(os.name != "posix", reason="needs a pseudo-terminal")
def test_guard_moves_stray_output_to_the_log(tmp_path: Path) -> None:
    import pty

    log = tmp_path / "out.log"
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(log)],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            close_fds=True,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(30) == 0
    finally:
        os.close(master)
    screen = b"".join(chunks).decode()
    logged = log.read_text()
    for line in ("drawn-by-the-app", "editor-output", "after-exit"):
        assert line in screen
    for line in ("stdout-noise", "stderr-noise", "print-noise", "child-noise", "more-noise"):
        assert line in logged and line not in screen


def test_guard_is_a_no_op_without_a_terminal(tmp_path: Path) -> None:
    # under pytest fd 2 is a pipe or file, never the user's terminal
    if os.isatty(2):
        pytest.skip("stderr is a terminal here")
    before = sys.__stderr__
    with TerminalGuard(tmp_path / "x.log") as guard:
        assert not guard.active
        with guard.terminal():
            pass
    assert sys.__stderr__ is before and not (tmp_path / "x.log").exists()


def test_log_handler_forwards_records() -> None:
    import logging

    seen: list[tuple[str, str]] = []
    handler = CallbackLogHandler(lambda level, msg: seen.append((level, msg)))
    logger = logging.getLogger("whale_lab.test_terminal")
    logger.addHandler(handler)
    try:
        logger.warning("disk %s", "full")
        logger.error("boom")
    finally:
        logger.removeHandler(handler)
    assert seen == [
        ("warning", "whale_lab.test_terminal: disk full"),
        ("error", "whale_lab.test_terminal: boom"),
    ]


RUN_TUI = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    from whale_lab.config import Config
    from whale_lab.tui.app import run_tui

    def noisy():
        time.sleep(0.5)
        os.write(2, b"NOISE-from-a-thread\\n")
        subprocess.run([sys.executable, "-c", "print('NOISE-from-a-child')"])

    threading.Thread(target=noisy, daemon=True).start()
    sys.exit(run_tui(Config(), sys.argv[1], replay_only=True))
    """
)


@pytest.mark.skipif(os.name != "posix", reason="needs a pseudo-terminal")
def test_run_tui_in_a_terminal_keeps_stray_output_off_the_screen(fixture_run: Path) -> None:
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = dict(os.environ, TERM="xterm-256color")
    proc = subprocess.Popen(
        [sys.executable, "-c", RUN_TUI, str(fixture_run)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    out = b""
    deadline = time.monotonic() + 60
    quit_sent = False
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    break
                if not data:
                    break
                out += data
            log = fixture_run / "tui-output.log"
            drawn = b"COMPLETED" in out and log.exists() and "NOISE-from-a-child" in log.read_text()
            if drawn and not quit_sent:
                os.write(master, b"q")
                quit_sent = True
            if proc.poll() is not None and not ready:
                break
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert quit_sent
    assert b"NOISE" not in out
    logged = (fixture_run / "tui-output.log").read_text()
    assert "NOISE-from-a-thread" in logged and "NOISE-from-a-child" in logged
