"""One harness host per candidate: its contract check, smoke run and scoring share one process.

Starting a host (a confined interpreter that loads the harness) costs 0.3-0.5 s, as much as a
small smoke run. A candidate's host is started when its checks first need it (after the static
checks, so code that fails them never runs) and kept while the phase advances that candidate;
it is closed when the phase moves on, or when a review pauses the phase for a person, so no idle
host outlives a step. A reviewer's edit gives the candidate new code, and so a new host.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class CandidateHosts:
    """Started harness hosts by candidate id, each for the code it was started on."""

    def __init__(self, start: Callable[[Path], Any]) -> None:
        self._start = start
        self._hosts: dict[str, tuple[str, Any]] = {}  # cid -> (code digest, host)
        self.started = 0

    def get(self, cid: str, path: str | Path) -> Any:
        """The candidate's host for the code now at `path`, started on first use."""
        p = Path(path)
        digest = hashlib.sha256(p.read_bytes()).hexdigest()
        held = self._hosts.get(cid)
        if held is not None and held[0] == digest:
            return held[1]
        self.release(cid)  # edited code: the old host has the old code loaded
        host = self._start(p)
        self.started += 1
        self._hosts[cid] = (digest, host)
        return host

    def opener(self, cid: str, path: str | Path) -> Callable[[], Any]:
        """`get` for later: what a check calls once it is ready to run the code."""
        return lambda: self.get(cid, path)

    def release(self, cid: str) -> None:
        held = self._hosts.pop(cid, None)
        if held is not None:
            held[1].close()

    @contextlib.contextmanager
    def held(self, cid: str) -> Iterator[None]:
        """Keep the candidate's host for the duration of the block, then close it."""
        try:
            yield
        finally:
            self.release(cid)

    def close(self) -> None:
        for cid in list(self._hosts):
            self.release(cid)
