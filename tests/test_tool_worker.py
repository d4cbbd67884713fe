"""Warm tool workers: one confined interpreter per episode, fed over a pipe.

What a warm worker must keep from the cold path (one fresh interpreter per call): the same
results and messages, the limits, and no state from one episode in the next; and what it adds:
restarts after a limit, timeout, crash or protocol error, and no process left after `close()` or
after the engine's own death. Speed is measured in benchmarks/tool_call_latency.py, not here.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from whale_lab import confine
from whale_lab.domains import tool_worker
from whale_lab.domains.interpreter import InterpreterLimits, run_python
from whale_lab.domains.math import MathDomain
from whale_lab.domains.tool_worker import ToolWorkers

CONF = confine.detect()
needs_bwrap = pytest.mark.skipif(
    not CONF.confined, reason=f"bwrap cannot confine on this machine: {CONF.reason}"
)
LIMITS = InterpreterLimits(timeout_s=5.0, memory_mb=256, max_output_chars=300)
FAST = InterpreterLimits(timeout_s=1.0, memory_mb=256, max_output_chars=300)
REPO = Path(__file__).resolve().parents[1]
SIZES = {"weight": 4, "harness": 2, "val": 2, "test": 2}
MARK = "import sys\nsys.whale_mark = 1\n"
HAS_MARK = "import sys\nprint(hasattr(sys, 'whale_mark'))\n"


@pytest.fixture
def pool() -> Iterator[ToolWorkers]:
    """A pool without spares, so that the processes it holds are the sessions' own."""
    workers = ToolWorkers(LIMITS, spares=0)
    yield workers
    workers.close()


def _gone(pid: int) -> bool:
    """No such process, or one that has ended and waits for its reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (bwrap, the sandbox's init, the interpreter)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _all_gone(pids: list[int], within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(_gone(p) for p in pids):
            return True
        time.sleep(0.05)
    return all(_gone(p) for p in pids)


# ------------------------------------------------------------------ the same as the cold path

SNIPPETS = [
    "import fractions\nprint(fractions.Fraction(1, 3) + 1)",
    "x = 1\ny = x / 0\n",
    "def f(:\n  pass",
    "print('a')\nimport sys\nsys.exit(3)",
    "import sys\nsys.exit('bye')",
    "import sys\nsys.exit(0)",
    "print(input())",
    "import os\nos._exit(0)",
    "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)",
    "import atexit\natexit.register(lambda: print('at exit'))\nprint('body')",
    "import threading, time\n"
    "t = threading.Thread(target=lambda: (time.sleep(0.2), print('thread')))\nt.start()",
    "import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise ValueError('boom')",
    "import sys\nsys.stdout.close()",
    "print('x' * 5000)",
    "while True:\n    print('y' * 100)\n",
    "block = bytearray(2 * 1024 ** 3)\nprint(len(block))",
    "import os\nos.write(1, b'raw\\n')\nprint('buffered')",
    "print(__name__, __file__ if '__file__' in dir() else None)\nimport sys\nprint(sys.argv)",
    # the snippet prints its own traceback: its source lines show, as on the cold path
    "import traceback\ntry:\n    1 / 0\nexcept ZeroDivisionError:\n    traceback.print_exc()\n"
    "print('after')",
    "import linecache\nprint(repr(linecache.getline('<python>', 1)))",
    "import threading\nprint(threading.active_count(), threading.current_thread().name)",
]


@pytest.mark.parametrize("code", SNIPPETS, ids=range(len(SNIPPETS)))
def test_a_warm_call_reads_exactly_like_a_cold_one(code: str, pool: ToolWorkers) -> None:
    warm = pool.session().run(code)
    cold = run_python(code, LIMITS)
    assert warm == cold


def test_a_timeout_reads_like_the_cold_one(pool: ToolWorkers) -> None:
    code = "print('started', flush=True)\nwhile True:\n    pass\n"
    warm = pool.session(FAST).run(code)
    assert warm == run_python(code, FAST)
    assert warm.timed_out and "TimeoutError" in warm.error and warm.stdout == "started\n"


# ------------------------------------------------------------------ no state between episodes


def test_each_call_gets_fresh_globals_and_builtins(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run("x = 41\nimport builtins\nbuiltins.len = lambda s: -1").ok
    r = session.run("print(len('ab'))\nprint(x)")
    assert r.stdout == "2\n" and "NameError" in r.error and "'x' is not defined" in r.error


def test_nothing_of_an_episode_reaches_the_next(pool: ToolWorkers) -> None:
    first = pool.session()
    poison = (
        "import builtins, math, json\n"
        "builtins.print = lambda *a, **k: None\n"
        "builtins.abs = lambda v: 'patched'\n"
        "math.pi = 3\n"
        "json.dumps = lambda *a, **k: 'patched'\n"
        "import sys\nsys.whale_mark = 1\n"
        "episode_secret = 'first'\n"
    )
    assert first.run(poison).ok
    within = first.run("import math\nimport sys\nsys.stdout.write(str(math.pi))")
    assert within.stdout == "3"  # one episode keeps its interpreter between its calls
    first.end()
    second = pool.session()
    r = second.run(
        "import math, json, sys\n"
        "print(abs(-2), math.pi, json.dumps([1]), hasattr(sys, 'whale_mark'))\n"
        "print('episode_secret' in globals())"
    )
    assert r.ok and r.stdout == "2 3.141592653589793 [1] False\nFalse\n"


def test_live_episodes_never_share_a_worker(pool: ToolWorkers) -> None:
    a, b = pool.session(), pool.session()
    assert a.run(MARK).ok
    assert b.run(HAS_MARK).stdout == "False\n"
    assert a.run(HAS_MARK).stdout == "True\n"
    assert len(pool.pids()) == 2


def test_a_math_episode_ends_its_worker_in_final_info() -> None:
    dom = MathDomain.builtin(1, SIZES, LIMITS)
    try:
        task = dom.tasks("test")[0]
        env = dom.make_env(task)
        call = {"type": "tool", "name": "python", "arguments": {"code": MARK}}
        assert not env.step(dom.normalise_action(call)).tool_error
        held = set(dom._tools.pids())  # the episode's worker and the spares
        env.final_info()
        ended = held - set(dom._tools.pids())
        assert len(ended) == 1 and _all_gone(list(ended))
        again = dom.make_env(task)
        check = {"type": "tool", "name": "python", "arguments": {"code": HAS_MARK}}
        assert again.step(dom.normalise_action(check)).observation["stdout"] == "False\n"
    finally:
        dom.close()


# ------------------------------------------------------------------ restarts


def test_a_timeout_restarts_the_worker_and_the_next_call_works(pool: ToolWorkers) -> None:
    session = pool.session(FAST)
    assert session.run(MARK).ok
    (before,) = pool.pids()
    r = session.run("while True:\n    pass\n")
    assert r.timed_out and "TimeoutError" in r.error
    assert _all_gone([before])
    after = session.run(HAS_MARK)
    assert after.ok and after.stdout == "False\n"
    assert pool.pids() != [before]


def test_a_memory_breach_restarts_the_worker_and_the_next_call_works(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run(MARK).ok
    r = session.run("block = bytearray(2 * 1024 ** 3)\nprint(len(block))")
    assert "MemoryError" in r.error and r.stdout == ""
    after = session.run(HAS_MARK + "print(len(bytearray(10 * 1024 ** 2)))")
    assert after.ok and after.stdout == "False\n10485760\n"


def test_a_crash_restarts_the_worker(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run(MARK).ok
    r = session.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert "SIGSEGV" in r.error
    assert session.run(HAS_MARK).stdout == "False\n"


def test_output_caps_hold_per_call_and_the_flood_restarts_the_worker(pool: ToolWorkers) -> None:
    session = pool.session()
    big = session.run("print('x' * 5000)")
    assert big.truncated and big.stdout.startswith("x" * 300) and len(big.stdout) < 400
    assert "truncated" in big.stdout
    flood = session.run("while True:\n    print('y' * 100)\n")
    assert flood.truncated and len(flood.stdout) < 400 and "OutputLimit" in flood.error
    raw = session.run("import os\nwhile True:\n    os.write(1, b'z' * 1000)\n")
    assert raw.truncated and len(raw.stdout) < 400 and raw.stdout.startswith("z")
    for _ in range(2):  # every call's output is its own, within the cap
        small = session.run("print('small')")
        assert small.ok and small.stdout == "small\n"


def test_code_that_breaks_the_reply_channel_gets_a_fresh_worker(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run(MARK).ok
    forge = (
        "import os\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        os.write(fd, b'\\xff\\xff\\xff\\xffnot a reply')\n"
        "    except OSError:\n"
        "        pass\n"
        "print('wrote')\n"
    )
    r = session.run(forge)
    assert "ProtocolError" in r.error
    assert session.run(HAS_MARK).stdout == "False\n"


def test_code_that_leaves_the_worker_unfit_is_run_on_a_fresh_one(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run("import os\nos.close(1)").ok
    r = session.run("print('fine')")
    assert r.ok and r.stdout == "fine\n"


def test_a_worker_is_replaced_after_its_call_budget(
    pool: ToolWorkers, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tool_worker, "CALLS_PER_WORKER", 3)
    session = pool.session()
    assert session.run(MARK).ok
    assert session.run(HAS_MARK).stdout == "True\n"
    assert session.run(HAS_MARK).stdout == "True\n"  # the third call: the worker retires after it
    assert session.run(HAS_MARK).stdout == "False\n"


def test_each_call_gets_its_own_cpu_allowance_on_a_long_lived_worker(pool: ToolWorkers) -> None:
    session = pool.session(FAST)  # 2 s of CPU time per call
    allowance = (
        "import resource\n"
        "used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
        "end = used + 0.2\n"
        "while sum(resource.getrusage(resource.RUSAGE_SELF)[:2]) < end:\n"
        "    pass\n"
        "print(2 < soft - used <= 3, hard > soft)\n"
    )
    for _ in range(3):  # CPU time used by earlier calls does not count against the next
        r = session.run(allowance)
        assert r.ok and r.stdout == "True True\n", r


def test_the_cpu_limit_stops_a_call_and_restarts_the_worker(pool: ToolWorkers) -> None:
    session = pool.session()
    assert session.run(MARK).ok
    spin = (
        "import resource\n"
        "used = int(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]))\n"
        "hard = resource.getrlimit(resource.RLIMIT_CPU)[1]\n"
        "resource.setrlimit(resource.RLIMIT_CPU, (used + 1, hard))\n"
        "while True:\n"
        "    pass\n"
    )
    r = session.run(spin)
    assert "TimeoutError: the code used more than 6 s of CPU time" in r.error, r
    assert session.run(HAS_MARK).stdout == "False\n"


# ------------------------------------------------------------------ threads and processes


def test_concurrent_episodes_from_many_threads_get_their_own_results(pool: ToolWorkers) -> None:
    sessions = [pool.session() for _ in range(12)]

    def episode(i: int) -> list[str]:
        s = sessions[i]
        out = [s.run(f"import sys\nsys.whale_mark = {i}\nprint({i})").stdout]
        out.append(s.run("import sys\nprint(sys.whale_mark * 10)").stdout)
        return out

    with ThreadPoolExecutor(max_workers=6) as ex:
        results = list(ex.map(episode, range(12)))
    assert results == [[f"{i}\n", f"{i * 10}\n"] for i in range(12)]


@needs_bwrap
def test_a_worker_started_from_a_thread_outlives_that_thread(pool: ToolWorkers) -> None:
    session = pool.session()
    started = threading.Thread(target=lambda: session.run(MARK))
    started.start()
    started.join()
    assert session.run(HAS_MARK).stdout == "True\n"


def test_no_process_outlives_close() -> None:
    workers = ToolWorkers(LIMITS, spares=2)
    sessions = [workers.session() for _ in range(3)]
    for s in sessions:
        assert s.run("print(1)").ok
    held = workers.pids()
    assert len(held) >= 3
    processes = [p for pid in held for p in _descendants(pid)]
    workers.close()
    assert workers.pids() == []
    assert _all_gone(processes), [p for p in processes if not _gone(p)]
    # a call after close still works, on a worker that stops with the call
    assert sessions[0].run("print(2)").stdout == "2\n" and workers.pids() == []


def test_a_pool_dropped_without_close_stops_its_workers() -> None:
    workers = ToolWorkers(LIMITS, spares=2)
    session = workers.session()
    assert session.run("print(1)").ok
    deadline = time.monotonic() + 10.0
    while len(workers.pids()) < 3 and time.monotonic() < deadline:  # the spares have started
        time.sleep(0.02)
    held = [p for pid in workers.pids() for p in _descendants(pid)]
    del session, workers
    gc.collect()
    assert _all_gone(held), [p for p in held if not _gone(p)]


def test_math_domain_close_stops_its_workers() -> None:
    dom = MathDomain.builtin(1, SIZES, LIMITS)
    env = dom.make_env(dom.tasks("test")[0])
    env.step(dom.normalise_action({"type": "tool", "name": "python",
                                   "arguments": {"code": "print(1)"}}))
    held = [p for pid in dom._tools.pids() for p in _descendants(pid)]
    assert held
    dom.close()
    assert _all_gone(held)


ENGINE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from whale_lab.domains.interpreter import InterpreterLimits
    from whale_lab.domains.tool_worker import ToolWorkers
    pool = ToolWorkers(InterpreterLimits(timeout_s=60.0))
    idle, busy = pool.session(), pool.session()
    idle.run("print(1)")
    print(" ".join(map(str, pool.pids())), flush=True)
    busy.run("import time\\nprint('sleeping', flush=True)\\ntime.sleep(60)")
    """
)


def test_workers_die_with_the_engine(tmp_path: Path) -> None:
    """An engine killed outright (SIGKILL: no close, no atexit) leaves no worker behind (only
    the capture files it had no chance to remove, here under tmp_path)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE.format(repo=str(REPO))],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        pids = [int(p) for p in line.split()]
        assert pids, "the engine printed no worker"
        time.sleep(0.5)  # the busy worker is now inside its sleep
        processes = [p for pid in pids for p in _descendants(pid)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _all_gone(processes, within_s=10.0), [p for p in processes if not _gone(p)]


# ------------------------------------------------------------------ without OS confinement


@pytest.fixture
def unconfined(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(confine, "_detected", confine.Confinement(False, reason="test: none"))
    monkeypatch.setattr(confine, "_warned", True)
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    yield


def test_without_confinement_warm_workers_refuse_unless_allowed(unconfined: None) -> None:
    workers = ToolWorkers(LIMITS, spares=0)
    try:
        with pytest.raises(confine.ConfinementError):
            workers.session().run("print(1)")
        allowed = InterpreterLimits(timeout_s=5.0, memory_mb=256, max_output_chars=300,
                                    allow_unconfined=True)
        session = workers.session(allowed)
        r = session.run("import sys\nprint('whale_lab' in sys.modules, sys.flags.no_site)")
        assert r.ok and r.stdout == "False 1\n"
        assert session.run("import whale_lab").error.endswith("No module named 'whale_lab'")
        mem = session.run("block = bytearray(2 * 1024 ** 3)")
        assert "MemoryError" in mem.error
        assert session.run("print('after')").stdout == "after\n"
    finally:
        held = [p for pid in workers.pids() for p in _descendants(pid)]
        workers.close()
    assert _all_gone(held)


def test_an_unconfined_worker_dies_with_the_engine(unconfined: None, tmp_path: Path) -> None:
    env = {**os.environ, confine.ALLOW_ENV: "1", "TMPDIR": str(tmp_path)}
    code = ENGINE.replace(
        "from whale_lab.domains.interpreter",
        "from whale_lab import confine\n"
        "confine._detected = confine.Confinement(False, reason='test')\n"
        "from whale_lab.domains.interpreter",
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code.format(repo=str(REPO))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert _all_gone(pids, within_s=10.0), [p for p in pids if not _gone(p)]


def test_a_program_larger_than_a_pipe_buffer_is_written_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The marshalled program goes to the worker through a pipe written before it starts."""
    from whale_lab.domains import tool_worker

    big = bytes(range(256)) * 600  # 150 KiB: past the default 64 KiB
    monkeypatch.setattr(tool_worker, "_worker_code", lambda: big)
    fd = tool_worker._code_pipe()
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    assert b"".join(chunks) == big
