"""One engine per run folder: a lock file naming the process that holds the run open."""

from __future__ import annotations

import os
import time
from pathlib import Path

from whale_lab.engine.errors import EngineError
from whale_lab.store import atomic_write_json, read_json

LOCK_FILE = "engine.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def holder(root: Path) -> int | None:
    """The live process other than this one that holds the folder open, if any."""
    data = read_json(root / LOCK_FILE, None)
    if not isinstance(data, dict):
        return None
    try:
        pid = int(data.get("pid", -1))
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 and pid != os.getpid() and _pid_alive(pid) else None


def acquire(root: Path) -> None:
    """Take the folder's lock, or fail naming the process that holds it (a dead one's is taken)."""
    path = root / LOCK_FILE
    data = read_json(path, None)
    if isinstance(data, dict):
        pid = int(data.get("pid", -1))
        if pid != os.getpid() and pid > 0 and _pid_alive(pid):
            raise EngineError(f"run {root} is already open in process {pid}; close it there first")
    atomic_write_json(path, {"pid": os.getpid(), "since": time.time()})


def release(root: Path) -> None:
    path = root / LOCK_FILE
    data = read_json(path, None)
    if isinstance(data, dict) and int(data.get("pid", -1)) == os.getpid():
        path.unlink(missing_ok=True)
