"""What the engine, the search phase and every front end share: commands and the review seam.

The engine has two inbound seams: a command channel polled at safe points, and a reviewer that
answers approve / reject / edit / pin for each candidate. The TUI, the headless CLI and the tests
each bring their own reviewer and push commands; the engine never knows which. These types live
below both the engine and the search phase, so neither imports the other's types.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

CommandKind = Literal["pause", "resume", "switch", "probe", "stop", "steer"]


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    by: str = "user"
    reason: str = ""
    args: dict[str, Any] = field(default_factory=dict)


class CommandChannel:
    """Thread-safe queue of commands plus a stop flag the engine checks often."""

    def __init__(self) -> None:
        self._q: queue.Queue[Command] = queue.Queue()
        self.stop_requested = threading.Event()
        self.paused = threading.Event()

    def send(self, command: Command) -> None:
        if command.kind == "stop":
            self.stop_requested.set()
            self.paused.clear()
        self._q.put(command)

    def drain(self) -> list[Command]:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out


@dataclass(frozen=True)
class ReviewItem:
    candidate_id: str
    diff: str
    hypothesis: str
    surface: str
    code: str
    smoke_success: float | None = None
    cited_traces: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReviewDecision:
    decision: Literal["approve", "reject", "edit", "pin", "pending"]
    reason: str = ""
    edited_code: str | None = None  # for "edit": the code to use instead (then approved)
    by: str = "human"


class Reviewer(Protocol):
    def review(self, item: ReviewItem) -> ReviewDecision:
        """Block until a decision, or return "pending" when the engine must stop first."""
        ...
