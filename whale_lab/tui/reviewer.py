"""The TUI's side of the review seam: the engine thread blocks here until a human decides.

`review` is called on the engine thread; `decide` on the UI thread. A stop request (or closing the
app) releases every waiting review with a "pending" decision, so quitting never hangs and the
candidate is asked for again when the run resumes. Nothing here imports textual.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from whale_lab.engine.control import CommandChannel, ReviewDecision, ReviewItem

VALID_DECISIONS = ("approve", "reject", "edit", "pin")


@dataclass
class _Slot:
    item: ReviewItem
    done: threading.Event = field(default_factory=threading.Event)
    decision: ReviewDecision | None = None


class TuiReviewer:
    """A `Reviewer` whose decisions come from the UI thread.

    `on_request(item)` runs on the engine thread when a new item arrives (the app uses it to wake
    the review panel); it must be thread-safe and must not block.
    """

    def __init__(
        self,
        commands: CommandChannel | None = None,
        on_request: Callable[[ReviewItem], None] | None = None,
        *,
        poll_s: float = 0.1,
    ) -> None:
        self.commands = commands
        self.on_request = on_request
        self.poll_s = poll_s
        self._lock = threading.Lock()
        self._slots: dict[str, _Slot] = {}
        self._closed = threading.Event()

    # ---------------------------------------------------------------- engine thread

    def review(self, item: ReviewItem) -> ReviewDecision:
        """Block until `decide` is called for this candidate, or a stop releases it."""
        if self._stop_requested():
            return ReviewDecision("pending", reason="stop requested", by="tui")
        slot = _Slot(item)
        with self._lock:
            self._slots[item.candidate_id] = slot
        if self.on_request is not None:
            try:
                self.on_request(item)
            except Exception:  # noqa: BLE001 - a dead UI must not take the engine down
                pass
        while True:
            if slot.done.wait(self.poll_s):
                assert slot.decision is not None
                return slot.decision
            if self._stop_requested():
                with self._lock:
                    # A decision may have raced the stop; it wins.
                    if slot.decision is not None:
                        return slot.decision
                    self._slots.pop(item.candidate_id, None)
                return ReviewDecision("pending", reason="stop requested", by="tui")

    def _stop_requested(self) -> bool:
        if self._closed.is_set():
            return True
        return self.commands is not None and self.commands.stop_requested.is_set()

    # ---------------------------------------------------------------- UI thread

    def pending(self) -> list[ReviewItem]:
        """Items the engine is waiting on, oldest first."""
        with self._lock:
            return [s.item for s in self._slots.values() if s.decision is None]

    def get(self, candidate_id: str) -> ReviewItem | None:
        with self._lock:
            slot = self._slots.get(candidate_id)
            return slot.item if slot is not None and slot.decision is None else None

    def is_waiting(self, candidate_id: str) -> bool:
        return self.get(candidate_id) is not None

    def decide(self, candidate_id: str, decision: ReviewDecision) -> bool:
        """Hand a decision to the waiting engine; False when nothing waits for this candidate."""
        if decision.decision not in VALID_DECISIONS:
            raise ValueError(
                f"review decision {decision.decision!r}: expected one of {', '.join(VALID_DECISIONS)}"
            )
        if decision.decision == "edit" and decision.edited_code is None:
            raise ValueError("review decision 'edit' needs edited_code")
        with self._lock:
            slot = self._slots.pop(candidate_id, None)
            if slot is None or slot.decision is not None:
                return False
            slot.decision = decision
        slot.done.set()
        return True

    def close(self) -> None:
        """Release every waiting review with "pending" (the app is quitting)."""
        self._closed.set()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()
