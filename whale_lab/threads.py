"""torch's intra-op threads, chosen from the cores actually free.

torch starts one thread per core it may run on; on a small machine that other processes keep
busy, those threads fight for the same cores and generation slows down many times over (20-30x
measured on a loaded 2-core CPU). whale-lab picks the count instead: the cores this process may
use (`os.sched_getaffinity`) less the 1-minute load average, at least one and never more than the
affinity allows. An explicit `OMP_NUM_THREADS`, or a torch already told otherwise by the program
that loaded it, is left alone.

Standard library only: the choice goes into `OMP_NUM_THREADS` before torch is imported (torch
reads it at import), and `torch.set_num_threads` is called only when torch is already loaded.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass

ENV = "OMP_NUM_THREADS"
log = logging.getLogger("whale_lab.threads")


@dataclass(frozen=True)
class ThreadChoice:
    """How many intra-op threads torch gets, and why."""

    threads: int | None  # None: an explicit setting that is not a count (left as it is)
    source: str  # "free cores", ENV, or "torch" (set by the program that loaded it)
    cores: int  # cores this process may run on
    load: float  # the 1-minute load average when the choice was made

    @property
    def chosen(self) -> bool:
        """Whether whale-lab picked the count (and so sets it)."""
        return self.source == "free cores"

    def describe(self) -> str:
        count = "unset" if self.threads is None else str(self.threads)
        if self.chosen:
            return (
                f"torch threads: {count} ({self.cores} cores allowed, 1-minute load "
                f"{self.load:.2f}); set {ENV} to choose another count"
            )
        where = f"{ENV}={count}" if self.source == ENV else "torch's own setting"
        return f"torch threads: {count}, from {where} ({self.cores} cores allowed)"


def choose_threads(
    cores: int, load: float | None, env: Mapping[str, str], torch_threads: int | None = None
) -> ThreadChoice:
    """The thread count for `cores` allowed cores at 1-minute load `load` (None: unknown).

    `env` is the process environment (an explicit `OMP_NUM_THREADS` wins); `torch_threads` is
    torch's count when torch is already loaded: anything but its default (one per allowed core)
    was set by the program, and is kept.
    """
    cores = max(1, int(cores))
    busy = load if load is not None and math.isfinite(load) and load > 0 else 0.0
    explicit = env.get(ENV, "").strip()
    if explicit:
        try:
            count: int | None = int(explicit)
        except ValueError:
            count = None
        return ThreadChoice(count if count and count > 0 else None, ENV, cores, busy)
    if torch_threads is not None and torch_threads != cores:
        return ThreadChoice(torch_threads, "torch", cores, busy)
    free = math.floor(cores - busy + 0.5)  # a core more than half free counts
    return ThreadChoice(max(1, min(cores, free)), "free cores", cores, busy)


def allowed_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def load_average() -> float | None:
    """The 1-minute load average, None where the OS does not report one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


_choice: ThreadChoice | None = None
_told: set[str] = set()


def configure(notify: Callable[[str], None] | None = None) -> ThreadChoice:
    """Choose and apply torch's thread count once per process; later calls return the same.

    What was picked is logged once (`whale_lab.threads`, info), and told once to `notify` (the
    app's log) when one is given.
    """
    global _choice
    if _choice is None:
        torch = sys.modules.get("torch")
        current = torch.get_num_threads() if torch is not None else None
        _choice = choose_threads(allowed_cores(), load_average(), os.environ, current)
        if _choice.chosen and _choice.threads is not None:
            os.environ[ENV] = str(_choice.threads)  # read by torch when it is imported
            if torch is not None:
                torch.set_num_threads(_choice.threads)
    message = _choice.describe()
    for sink, say in (("log", log.info), ("notify", notify)):
        if say is not None and sink not in _told:
            _told.add(sink)
            say(message)
    return _choice
