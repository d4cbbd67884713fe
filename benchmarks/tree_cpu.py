"""CPU seconds of this process and every process below it, the sandboxed ones included.

`os.times()` counts a child's CPU only once the child has exited and been waited for. whale-lab's
tool workers and harness hosts stay alive across calls and run under bwrap in their own PID
namespace, so their CPU never reached the benchmarks' totals: the arms that use them looked
cheaper than they were. Here the live descendants are found through
`/proc/<pid>/task/<tid>/children` and their user + system time (and that of the children they
have reaped) is added, read from `/proc/<pid>/stat`. Where `/proc` is missing (not Linux) the
figure falls back to `os.times()` and `exact` says so.

A descendant that exits and is reaped inside the tree moves its CPU from its own line to its
parent's reaped total, so the sum is continuous. A sandboxed process does not: bwrap does not
pass its sandbox's CPU on to whoever waits for bwrap, so a worker or host that is stopped between
two readings would take its CPU with it. `track_departures()` reads each tool worker's and
harness host's CPU just before whale-lab stops it and keeps it in `departed` (less what the wait
for it then adds to this process's reaped total, so an unconfined child is not counted twice).
What stays uncounted is the cold one-call interpreter (`interpreter.run_python`, used only where a
warm worker cannot be), whose CPU ends with it.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

# what a descendant's command line says it is (the first match wins)
KINDS = (
    ("tool", "_code = marshal.loads("),  # the warm worker's loader, passed with -c
    ("tool", "mem, cpu, fsize, path = int(sys.argv[1])"),  # a cold, one-call interpreter
    ("host", "whale_lab.harness.host_main"),
)


@dataclass(frozen=True)
class TreeCpu:
    """One reading: CPU seconds so far, this process and each kind of descendant."""

    own: float  # this process, all its threads
    reaped: float  # its waited-for children (os.times' children fields)
    live: dict[str, float] = field(default_factory=dict)  # kind -> live descendants' CPU
    exact: bool = True  # False: no /proc, live descendants not counted
    gone: dict[str, float] = field(default_factory=dict)  # kind -> stopped ones (departed)

    @property
    def total(self) -> float:
        return self.own + self.reaped + sum(self.live.values()) + sum(self.gone.values())

    def kind(self, name: str) -> float:
        """CPU of one kind of descendant, live or stopped."""
        return self.live.get(name, 0.0) + self.gone.get(name, 0.0)


departed: dict[str, float] = {}  # kind -> CPU of descendants read just before they were stopped
_DEPARTED_LOCK = threading.Lock()


def _stat_cpu(pid: int) -> float | None:
    """utime + stime + cutime + cstime of `pid`, in seconds (None if it is gone)."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the name may hold spaces and parentheses
    # fields[0] is the state (field 3); utime..cstime are fields 14..17
    return sum(int(x) for x in fields[11:15]) / TICK


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out.extend(int(x) for x in (task / "children").read_text().split())
        except OSError:
            continue
    return out


def _kind_of(pid: int) -> str | None:
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, UnicodeDecodeError):
        return None
    for kind, marker in KINDS:
        if marker in cmdline:
            return kind
    return None


def _subtree(roots: list[int]) -> dict[str, float]:
    """kind -> CPU of the processes under (and including) `roots`.

    Each root's subtree takes the kind of the first process in it that names one (bwrap's own
    command line carries the sandboxed command, so the wrapper counts too).
    """
    live: dict[str, float] = {}
    todo: list[tuple[int, str | None]] = [(c, None) for c in roots]
    seen: set[int] = set()
    while todo:
        child, inherited = todo.pop()
        if child in seen:
            continue
        seen.add(child)
        cpu = _stat_cpu(child)
        if cpu is None:
            continue
        kind = inherited or _kind_of(child)
        live[kind or "other"] = live.get(kind or "other", 0.0) + cpu
        todo.extend((c, kind) for c in _children(child))
    return live


def read(pid: int | None = None) -> TreeCpu:
    """CPU seconds so far of this process (or `pid`, for its descendants) and its descendants."""
    t = os.times()
    own, reaped = t.user + t.system, t.children_user + t.children_system
    root = os.getpid() if pid is None else pid
    with _DEPARTED_LOCK:
        gone = dict(departed)
    if not (PROC / str(root) / "task").is_dir():
        return TreeCpu(own, reaped, {}, exact=False, gone=gone)
    return TreeCpu(own, reaped, _subtree(_children(root)), gone=gone)


def _reaped() -> float:
    t = os.times()
    return t.children_user + t.children_system


def _keep_on_stop(stop: Callable[..., Any], pid_of: Callable[[Any], int | None]) -> Any:
    """`stop` (a method) that first reads its process's subtree into `departed`."""

    @functools.wraps(stop)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        pid = pid_of(self)
        before = _subtree([pid]) if pid else {}
        reaped0 = _reaped()
        try:
            return stop(self, *args, **kwargs)
        finally:
            double = _reaped() - reaped0  # an unconfined child, waited for just now
            with _DEPARTED_LOCK:
                for kind, cpu in before.items():
                    departed[kind] = departed.get(kind, 0.0) + max(0.0, cpu - double)
                    double = max(0.0, double - cpu)

    wrapper.__tree_cpu_tracked__ = True  # type: ignore[attr-defined]
    return wrapper


def track_departures() -> None:
    """Count whale-lab's tool workers and harness hosts after they are stopped (idempotent)."""
    from whale_lab.domains.tool_worker import ToolWorker
    from whale_lab.harness.host import HarnessHost

    def host_pid(host: Any) -> int | None:
        proc = getattr(host, "_proc", None)
        return None if proc is None or proc.poll() is not None else proc.pid

    def worker_pid(worker: Any) -> int | None:
        return None if worker.proc.poll() is not None else worker.proc.pid

    for cls, name, pid_of in (
        (ToolWorker, "_terminate", worker_pid),
        (HarnessHost, "close", host_pid),
        (HarnessHost, "_restart", host_pid),
    ):
        method = getattr(cls, name)
        if not getattr(method, "__tree_cpu_tracked__", False):
            setattr(cls, name, _keep_on_stop(method, pid_of))


def seconds() -> float:
    """Total CPU seconds so far of this process and everything below it."""
    return read().total
