"""The review queue: one answer to "what waits for a decision, and what was decided".

Three sources feed it, and they disagree for a moment after every change: the run's recorded
reviews (`RunView.reviews`, from events), the items the engine is blocked on right now (the
reviewer), and decisions sent from the TUI whose `ReviewDecided` has not arrived yet. Merging
them in one place keeps the review tab, its label, the header and the review keys in step.
Nothing here imports textual.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from whale_lab.events import Event
from whale_lab.seams import ReviewDecision, ReviewItem
from whale_lab.tui.state import ReviewEntry, RunView

#: How many decided candidates the queue still lists, newest first.
MAX_DECIDED = 20


class WaitingReviews(Protocol):
    """The part of `ThreadReviewer` the queue reads: what the engine waits on, and deciding it."""

    def pending(self) -> list[ReviewItem]: ...

    def get(self, candidate_id: str) -> ReviewItem | None: ...

    def is_waiting(self, candidate_id: str) -> bool: ...

    def decide(self, candidate_id: str, decision: ReviewDecision) -> bool: ...


class ReviewQueue:
    """Merges recorded reviews, the reviewer's waiting items and decisions sent from here.

    `live_ids` is what the engine was waiting on at the last `sync` (less what was decided here
    since): the panel marks those as live. `wake` may be called from the engine thread.
    """

    def __init__(self, view: RunView, reviewer: WaitingReviews) -> None:
        self.view = view
        self.reviewer = reviewer
        self.live_ids: set[str] = set()
        self._sent: dict[str, str] = {}  # candidate id -> decision sent, not yet recorded
        self._wakeup = False

    def attach(self, reviewer: WaitingReviews) -> None:
        """A fresh engine brings a fresh reviewer; what was sent and seen so far is kept."""
        self.reviewer = reviewer

    def wake(self) -> None:
        """Engine thread: a candidate started waiting; the next `sync` reports a change."""
        self._wakeup = True

    # ------------------------------------------------------------------ feeding

    def sync(self) -> tuple[bool, list[str]]:
        """Take in what the reviewer waits on now: (whether the queue changed, new ids sorted)."""
        live = {item.candidate_id for item in self.reviewer.pending()}
        if live == self.live_ids and not self._wakeup:
            return False, []
        arrived = sorted(live - self.live_ids)
        self.live_ids = live
        self._wakeup = False
        return True, arrived

    def observe(self, events: Iterable[Event]) -> None:
        """A recorded decision supersedes the one sent from here (the view now holds it)."""
        for ev in events:
            if getattr(ev, "type", "") == "review_decided":
                self._sent.pop(getattr(ev, "candidate_id", ""), None)

    def decide(self, candidate_id: str, decision: ReviewDecision) -> bool:
        """Hand a decision to the engine; False when nothing waits for this candidate."""
        if not self.reviewer.decide(candidate_id, decision):
            return False
        self._sent[candidate_id] = decision.decision
        self.live_ids.discard(candidate_id)
        return True

    # ------------------------------------------------------------------ answers

    def is_waiting(self, candidate_id: str) -> bool:
        """Whether the engine waits on this candidate now (so a decision would reach it)."""
        return self.reviewer.is_waiting(candidate_id)

    def item(self, candidate_id: str) -> ReviewItem | None:
        return self.reviewer.get(candidate_id)

    def _merged(self) -> list[ReviewEntry]:
        entries: dict[str, ReviewEntry] = dict(self.view.reviews)
        for item in self.reviewer.pending():
            known = entries.get(item.candidate_id)
            if known is None or known.status != "pending":
                entries[item.candidate_id] = ReviewEntry(
                    candidate_id=item.candidate_id,
                    diff=item.diff,
                    hypothesis=item.hypothesis,
                    surface=item.surface,
                    smoke_success=item.smoke_success,
                    cited_traces=tuple(item.cited_traces),
                )
        out: list[ReviewEntry] = []
        for cid, entry in entries.items():
            sent = self._sent.get(cid)
            if sent and entry.status == "pending":
                entry = dataclasses.replace(entry, status=sent, reason="sent")
            out.append(entry)
        return out

    def _split(self) -> tuple[list[ReviewEntry], list[ReviewEntry]]:
        merged = self._merged()
        pending = [e for e in merged if e.status == "pending"]
        decided = [e for e in merged if e.status != "pending"][-MAX_DECIDED:][::-1]
        return pending, decided

    def pending(self) -> list[ReviewEntry]:
        """Candidates still waiting for a decision (live or recorded), oldest first."""
        return self._split()[0]

    def decided(self) -> list[ReviewEntry]:
        """The latest decisions (recorded or sent from here), newest first."""
        return self._split()[1]

    def entries(self) -> list[ReviewEntry]:
        """What the review tab lists: pending first, then the latest decisions."""
        pending, decided = self._split()
        return pending + decided
