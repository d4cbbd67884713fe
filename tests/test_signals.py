"""SIGINT and SIGTERM in real headless processes: a recorded stop, the lock released, 130 or 143.

Each test starts `python -m whale_lab ... --headless` (or another headless command) on the
embedded default with a tiny chess config, waits until the run has finished an episode, signals
it and checks what a user and a resume rely on: the exit code, the resume hint, a `run_finished`
event with status "stopped", no `engine.lock` left, and no C++ abort ("terminate called without
an active exception" / "Aborted", exit 134), which a stop used to end in.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

CONFIG = """\
[run]
directory = "{runs}"
seed = 3
[model]
path = "micro"
[domain]
name = "chess"
[domain.splits]
weight = 8
harness = 2
val = 2
test = 2
[sampling]
k = 1
max_new_tokens = 16
[rsft]
prompts_per_step = 2
samples_per_prompt = 2
eval_every = 10.0
epochs = 1.0
[harness_search]
candidates_per_iteration = 1
smoke_tasks = 1
iterations = 2
[schedule]
kind = "whale"
cycles = 1
weight_epochs = 1.0
first_weight_epochs = 0.0
harness_iterations = 2
[approval]
mode = "auto"
"""
ABORT_SIGNS = ("terminate called", "Aborted", "Fatal Python error", "Traceback")


@dataclass
class Proc:
    """One whale-lab process, its output files and the folder its runs go to."""

    proc: subprocess.Popen[str]
    root: Path
    out: IO[str]
    err: IO[str]

    def stderr(self) -> str:
        self.err.flush()
        return (self.root / "stderr.txt").read_text(encoding="utf-8", errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.out.close()
        self.err.close()


def start(tmp: Path, *args: str) -> Proc:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "whale.toml").write_text(CONFIG.format(runs=tmp / "runs"), encoding="utf-8")
    out = open(tmp / "stdout.txt", "w", encoding="utf-8")  # noqa: SIM115 - closed by Proc.close
    err = open(tmp / "stderr.txt", "w", encoding="utf-8")  # noqa: SIM115
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "whale_lab", "--config", str(tmp / "whale.toml"), *args],
        cwd=tmp,
        stdout=out,
        stderr=err,
        env=env,
        text=True,
    )
    return Proc(proc, tmp, out, err)


def progress(p: Proc, marker: str = '"episode_finished"') -> Path | None:
    """The run folder under `p.root` that has done an episode, if one has."""
    for events in (p.root / "runs").rglob("events.jsonl"):
        if marker in events.read_text(encoding="utf-8", errors="replace"):
            return events.parent
    for traces in (p.root / "runs").rglob("traces/*.jsonl"):
        if traces.stat().st_size > 0:
            return traces.parent.parent
    if p.proc.poll() is not None:
        raise AssertionError(f"exited {p.proc.returncode} early:\n{p.stderr()[-3000:]}")
    return None


def signal_when_busy(procs: dict[str, tuple[Proc, int]], timeout: float = 90.0) -> dict[str, Path]:
    """Send each process its signal as soon as it has done an episode; their run folders."""
    runs: dict[str, Path] = {}
    deadline = time.monotonic() + timeout
    while len(runs) < len(procs):
        for name, (p, sig) in procs.items():
            if name not in runs and (run := progress(p)) is not None:
                p.proc.send_signal(sig)
                runs[name] = run
        if time.monotonic() > deadline:
            waiting = [n for n in procs if n not in runs]
            raise AssertionError(f"no episode within {timeout:.0f}s: {waiting}")
        time.sleep(0.05)
    return runs


def busy(p: Proc, timeout: float = 90.0) -> Path:
    """Wait until the process has done an episode; its run folder."""
    deadline = time.monotonic() + timeout
    while (run := progress(p)) is None:
        assert time.monotonic() < deadline, f"no episode within {timeout:.0f}s:\n{p.stderr()}"
        time.sleep(0.05)
    return run


def finished(run: Path) -> list[dict]:
    lines = (run / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == "run_finished"]


def check_stopped(p: Proc, run: Path, code: int, hint: str) -> None:
    rc = p.proc.wait(90)
    err = p.stderr()
    assert rc == code, err[-3000:]
    assert not any(s in err for s in ABORT_SIGNS), err[-3000:]
    assert hint in err, err[-3000:]
    assert [e["status"] for e in finished(run)][-1:] == ["stopped"], err[-3000:]
    assert not (run / "engine.lock").exists()


@pytest.mark.slow
def test_run_headless_stops_on_sigint_and_sigterm(tmp_path: Path) -> None:
    """Both at once (they share the two cores); SIGINT exits 130, SIGTERM 143."""
    procs = {
        "int": (start(tmp_path / "int", "run", "--headless"), signal.SIGINT),
        "term": (start(tmp_path / "term", "run", "--headless"), signal.SIGTERM),
    }
    try:
        runs = signal_when_busy(procs)
        for name, (p, sig) in procs.items():
            hint = f"resume with: whale-lab resume {runs[name]}"
            check_stopped(p, runs[name], 128 + sig, hint)
            assert "stopped at a safe point" in finished(runs[name])[-1]["message"]
    finally:
        for p, _ in procs.values():
            p.close()


@pytest.mark.slow
def test_a_second_sigint_leaves_at_once_and_the_run_resumes(tmp_path: Path) -> None:
    p = start(tmp_path / "twice", "run", "--headless")
    try:
        run = busy(p)
        p.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 30
        while "stopping at the next safe point" not in p.stderr():
            assert time.monotonic() < deadline, p.stderr()[-3000:]
            time.sleep(0.01)
        sent = time.monotonic()
        p.proc.send_signal(signal.SIGINT)
        rc = p.proc.wait(30)
        err = p.stderr()
        assert rc == 130 and time.monotonic() - sent < 5, err[-3000:]
        assert not any(s in err for s in ABORT_SIGNS), err[-3000:]
        # mostly the second Ctrl-C comes before the safe point; where the stop won the race it
        # is recorded instead (the process exits 130 either way, never via shutdown)
        left = f"left without waiting; resume with: whale-lab resume {run}" in err
        assert left or [e["status"] for e in finished(run)] == ["stopped"], err[-3000:]
        assert not (run / "engine.lock").exists()
    finally:
        p.close()
    # the folder left behind resumes; SIGTERM stops the resumed run like a new one
    q = start(tmp_path / "twice", "resume", str(run), "--headless")
    try:
        before = (run / "events.jsonl").read_text(encoding="utf-8").count('"episode_finished"')
        deadline = time.monotonic() + 90
        while (run / "events.jsonl").read_text(encoding="utf-8").count(
            '"episode_finished"'
        ) <= before:
            assert time.monotonic() < deadline and q.proc.poll() is None, q.stderr()[-3000:]
            time.sleep(0.05)
        q.proc.send_signal(signal.SIGTERM)
        check_stopped(q, run, 143, f"resume with: whale-lab resume {run}")
    finally:
        q.close()


def test_stop_signals_ask_once_then_leave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The handlers in process, with real signals: SIGTERM asks for a stop once (a second
    SIGTERM changes nothing), a later SIGINT leaves at once, releasing the run's lock."""
    from rich.console import Console

    from whale_lab.commands import common
    from whale_lab.engine import runlock

    def exit_now(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(common, "_exit_now", exit_now)
    runlock.acquire(tmp_path)
    asked: list[str] = []
    # What was there before: Python's own handler, or SIG_IGN where the test process was started
    # in the background by a shell, which ignores SIGINT for it.
    before = signal.getsignal(signal.SIGINT)
    signals = common.StopSignals(Console(stderr=True, highlight=False))
    try:
        with signals, signals.watch(asked.append):
            signals.resume_at(tmp_path)
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # handlers run between bytecodes of this thread
            assert asked == ["SIGTERM"] and signals() and signals.exit_code == 143
            assert (tmp_path / runlock.LOCK_FILE).exists()
            with pytest.raises(SystemExit) as left:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        assert left.value.code == 130
        assert not (tmp_path / runlock.LOCK_FILE).exists()
        err = capsys.readouterr().err
        assert err.count("stopping at the next safe point") == 1
        assert f"left without waiting; resume with: whale-lab resume {tmp_path}" in err
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGINT) is before


COMMANDS = {
    "train": (("train",), "resume with: whale-lab train --resume"),
    "search": (("search",), "resume with: whale-lab search --resume"),
    # waves of 4 episodes (batch_size 1): the first is done well before the last
    "eval": (
        ("eval", "--split", "weight", "--k", "2", "--set", "sampling.batch_size=1"),
        "run the same eval again",
    ),
    "probe": (("probe",), "probe again with: whale-lab probe --run"),
    "compare": (("compare", "--schedules", "whale", "--seeds", "0"), "run the same compare"),
}


@pytest.mark.slow
def test_every_other_headless_command_stops_on_sigterm(tmp_path: Path) -> None:
    """train, search, eval, probe and compare, all at once: each records its stop, exits 143."""
    procs = {
        name: (start(tmp_path / name, *args), signal.SIGTERM)
        for name, (args, _) in COMMANDS.items()
    }
    try:
        runs = signal_when_busy(procs)
        for name, (p, _) in procs.items():
            check_stopped(p, runs[name], 143, COMMANDS[name][1])
    finally:
        for p, _ in procs.values():
            p.close()
