"""The app in a real pseudo-terminal: it fills the terminal it draws on and follows resizes.

Snapshot tests set the size themselves, so they cannot see how the app measures a terminal.
Here `whale-lab tui --run <recorded run> --view` runs under a pty of a given size, its output
is fed to a terminal emulator (pyte) and the emulated screen is read back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pyte = pytest.importorskip("pyte")
pytestmark = pytest.mark.skipif(os.name != "posix", reason="needs a pseudo-terminal")

FIXTURE_RUN = Path(__file__).resolve().parent / "fixtures" / "run"
REPO = Path(__file__).resolve().parents[2]


class PtyApp:
    """`whale-lab` under a pty of `cols` x `rows`, its screen emulated by pyte."""

    def __init__(
        self, args: list[str], cols: int, rows: int, cwd: Path, stdout: int | None = None
    ) -> None:
        """`stdout`: a file descriptor for fd 1 instead of the pty (Textual draws on fd 2), so
        a test can tell what went to stderr."""
        import pty

        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.output = bytearray()  # everything written to the terminal, for what follows exit
        self.master, slave = pty.openpty()
        self._set_size(cols, rows, slave)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env.update(TERM="xterm-256color", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "whale_lab", *args],
            stdin=slave,
            stdout=slave if stdout is None else stdout,
            stderr=slave,
            close_fds=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        os.close(slave)

    @staticmethod
    def _set_size(cols: int, rows: int, fd: int) -> None:
        import fcntl
        import struct
        import termios

        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def pump(self, seconds: float = 0.1) -> None:
        import select

        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            ready, _, _ = select.select([self.master], [], [], max(0.0, left))
            if ready:
                try:
                    data = os.read(self.master, 65536)
                except OSError:
                    return
                if not data:
                    return
                self.output += data
                self.stream.feed(data)
            elif left <= 0:
                return

    def rows(self) -> list[str]:
        return list(self.screen.display)

    def wait_for(self, check: object, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.2)
            if check(self.rows()):  # type: ignore[operator]
                return True
            if self.proc.poll() is not None:
                self.pump(0.2)
                return bool(check(self.rows()))  # type: ignore[operator]
        return False

    def text(self) -> str:
        """All output as plain text, escape sequences removed (the app's frames included)."""
        import re

        raw = self.output.decode("utf-8", errors="replace")
        return re.sub(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-_])", "", raw)

    def wait_exit(self, timeout: float = 60.0) -> int:
        """Read the terminal until the process ends, then what it wrote last; its exit code."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.pump(0.1)
        code = self.proc.wait(5)
        self.pump(0.3)  # what it printed last, after leaving the app's screen
        os.close(self.master)
        return code

    def resize(self, cols: int, rows: int) -> None:
        self.screen.resize(rows, cols)
        self._set_size(cols, rows, self.master)
        os.kill(self.proc.pid, signal.SIGWINCH)

    def quit(self) -> int:
        os.write(self.master, b"q")
        deadline = time.monotonic() + 30
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.pump(0.1)
        code = self.proc.wait(5)
        os.close(self.master)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def _footer_last(rows: list[str]) -> bool:
    """The footer (its help and quit keys) is drawn on the terminal's last row."""
    last = rows[-1]
    return "quit" in last.lower() and "help" in last.lower()


def _reaches(rows: list[str], column: int) -> bool:
    return any(len(r.rstrip()) > column for r in rows[:-1])


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(FIXTURE_RUN, dst)
    return dst


@pytest.mark.parametrize("cols,rows", [(120, 40), (80, 24)])
def test_the_app_fills_the_terminal_it_draws_on(run_copy: Path, cols: int, rows: int) -> None:
    app = PtyApp(["tui", "--run", str(run_copy), "--view"], cols, rows, REPO)
    try:
        assert app.wait_for(_footer_last), "\n".join(app.rows())
        screen = app.rows()
        assert "COMPLETED" in screen[0] or any("COMPLETED" in r for r in screen[:3])
        if cols > 80:
            assert _reaches(screen, 80), "nothing drawn past column 80:\n" + "\n".join(screen)
        assert app.quit() == 0
    finally:
        app.kill()
    # what libraries write to the terminal lands in the run folder, as documented
    assert (run_copy / "tui-output.log").exists()


def test_the_app_follows_a_resize(run_copy: Path) -> None:
    app = PtyApp(["tui", "--run", str(run_copy), "--view"], 80, 24, REPO)
    try:
        assert app.wait_for(_footer_last), "\n".join(app.rows())
        app.resize(120, 40)
        assert app.wait_for(lambda r: len(r) == 40 and _footer_last(r) and _reaches(r, 80)), (
            "\n".join(app.rows())
        )
        app.resize(90, 30)
        assert app.wait_for(lambda r: len(r) == 30 and _footer_last(r)), "\n".join(app.rows())
        assert app.quit() == 0
    finally:
        app.kill()


LIVE_CONFIG = """\
[run]
directory = "runs"
seed = 3
[model]
path = "micro"
[domain]
name = "chess"
[domain.splits]
weight = 8
harness = 2
val = 4
test = 2
[sampling]
k = 1
max_new_tokens = 16
[harness_search]
candidates_per_iteration = 1
smoke_tasks = 1
[schedule]
kind = "harness-only"
total_harness_iterations = 1000
[approval]
mode = "manual"
"""


def test_a_clean_quit_prints_the_resume_command(tmp_path: Path) -> None:
    """A bare `whale-lab` on a fresh folder starts the configured run; `q` (and yes) stops it
    at a safe point, and the command that resumes it is printed once the app has left the
    screen. (1,000 harness iterations: the run cannot finish before the quit, and a finished
    run rightly prints no hint.)"""
    (tmp_path / "whale.toml").write_text(LIVE_CONFIG, encoding="utf-8")
    with open(tmp_path / "stdout.txt", "wb") as out:
        app = PtyApp([], 100, 30, tmp_path, stdout=out.fileno())
    try:
        assert app.wait_for(lambda r: any("A new run" in row for row in r)), "\n".join(app.rows())
        os.write(app.master, b"\x1b")  # close the first-run panel
        assert app.wait_for(lambda r: "RUNNING" in "\n".join(r[:3]), timeout=120), "\n".join(
            app.rows()
        )
        os.write(app.master, b"q")
        assert app.wait_for(lambda r: any("Stop the engine" in row for row in r)), "\n".join(
            app.rows()
        )
        os.write(app.master, b"y")
        assert app.wait_exit(120) == 0, app.text()[-3000:]
    finally:
        app.kill()
    runs = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1
    hint = f"continue it with `whale-lab resume runs/{runs[0].name}`"
    # on stderr (the terminal; stdout went to a file), and left on the screen (a long line
    # wraps, so the emulated rows are read joined)
    output = runs[0] / "tui-output.log"
    why = "\n".join(
        (
            app.text()[-1500:],
            "stdout: " + (tmp_path / "stdout.txt").read_text(errors="replace")[-800:],
            "tui-output.log: "
            + (output.read_text(errors="replace")[-800:] if output.exists() else ""),
            "events: " + (runs[0] / "events.jsonl").read_text(errors="replace")[-800:],
        )
    )
    assert hint in " ".join(app.text().split()), why
    assert hint in "".join(app.rows()), "\n".join(app.rows())
    assert hint not in (tmp_path / "stdout.txt").read_text(encoding="utf-8", errors="replace")
    assert not (runs[0] / "engine.lock").exists()


MOVE_LOG = """
import os, sys
from whale_lab.tui.terminal import TerminalGuard

early, final = sys.argv[1], sys.argv[2]
with TerminalGuard(early) as guard:
    assert guard.active
    os.write(1, b"before-the-run-folder\\n")
    guard.move_log(final)
    os.write(2, b"after-the-run-folder\\n")
"""


def test_output_before_the_run_folder_exists_moves_into_it(tmp_path: Path) -> None:
    import pty

    early, final = tmp_path / ".tui-output-1.log", tmp_path / "run" / "tui-output.log"
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", MOVE_LOG, str(early), str(final)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    try:
        while True:
            try:
                if not os.read(master, 4096):
                    break
            except OSError:
                break
        assert proc.wait(30) == 0
    finally:
        os.close(master)
    assert not early.exists()
    assert final.read_text().splitlines() == ["before-the-run-folder", "after-the-run-folder"]
