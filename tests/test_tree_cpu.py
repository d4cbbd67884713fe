"""The benchmarks' CPU clock counts processes that `os.times()` cannot see."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import tree_cpu  # noqa: E402

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n{after}"

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc")


def _os_times() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _wait_for_cpu(pid: int, seconds: float) -> None:
    deadline = time.monotonic() + 30
    while (tree_cpu._stat_cpu(pid) or 0.0) < seconds and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_live_grandchild_is_counted_and_named_by_its_command_line() -> None:
    """A worker that lives on after its work (as whale-lab's do), under a wrapper process."""
    marker = "_code = marshal.loads("  # what a tool worker's command line carries
    inner = BURN.format(s=0.3, after=f"# {marker}\ntime.sleep(30)")
    wrapper = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}])"
    a, t0 = tree_cpu.read(), _os_times()
    proc = subprocess.Popen([sys.executable, "-c", wrapper])
    try:
        deadline = time.monotonic() + 30
        while tree_cpu.read().kind("tool") - a.kind("tool") < 0.3:
            assert time.monotonic() < deadline, tree_cpu.read()
            time.sleep(0.05)
        b, t1 = tree_cpu.read(), _os_times()
    finally:
        proc.kill()
        proc.wait()
    assert b.total - a.total >= 0.3
    assert t1 - t0 < 0.2  # what the old clock saw of it: nothing (the child is alive)


def test_a_reaped_child_moves_to_the_reaped_total_without_being_counted_twice() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.3, after="time.sleep(30)")])
    _wait_for_cpu(proc.pid, 0.3)
    live = tree_cpu.read()
    proc.kill()
    proc.wait()
    reaped = tree_cpu.read()
    assert live.live.get("other", 0.0) >= 0.3
    assert reaped.total == pytest.approx(live.total, abs=0.1)


def test_a_stopped_worker_keeps_its_cpu_in_departed() -> None:
    """`track_departures` reads a tool worker just before whale-lab stops it."""
    from whale_lab.domains.interpreter import InterpreterLimits
    from whale_lab.domains.tool_worker import ToolWorkers

    tree_cpu.track_departures()
    pool = ToolWorkers(InterpreterLimits(allow_unconfined=True), spares=0)
    try:
        before = tree_cpu.read()
        session = pool.session()
        result = session.run(BURN.format(s=0.3, after="print('done')"))
        assert result.ok, result.error
        session.end()
        after = tree_cpu.read()
    finally:
        pool.close()
    assert after.gone.get("tool", 0.0) - before.gone.get("tool", 0.0) >= 0.25
    assert after.total - before.total >= 0.3
