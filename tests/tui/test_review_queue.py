"""The review queue merges recorded reviews, what the engine waits on, and decisions sent."""

from __future__ import annotations

from whale_lab.events import ReviewDecided, ReviewRequested
from whale_lab.seams import ReviewDecision, ReviewItem
from whale_lab.tui.review_queue import MAX_DECIDED, ReviewQueue
from whale_lab.tui.state import RunView


class FakeReviewer:
    """Stands in for `ThreadReviewer`: items the engine waits on, decided from the test."""

    def __init__(self) -> None:
        self.waiting: dict[str, ReviewItem] = {}
        self.decisions: list[tuple[str, str]] = []

    def wait_on(self, cid: str) -> None:
        self.waiting[cid] = ReviewItem(
            candidate_id=cid, diff=f"+{cid}", hypothesis="h", surface="s", code="x = 1\n"
        )

    def pending(self) -> list[ReviewItem]:
        return list(self.waiting.values())

    def get(self, candidate_id: str) -> ReviewItem | None:
        return self.waiting.get(candidate_id)

    def is_waiting(self, candidate_id: str) -> bool:
        return candidate_id in self.waiting

    def decide(self, candidate_id: str, decision: ReviewDecision) -> bool:
        if self.waiting.pop(candidate_id, None) is None:
            return False
        self.decisions.append((candidate_id, decision.decision))
        return True


def requested(cid: str) -> ReviewRequested:
    return ReviewRequested(candidate_id=cid, diff=f"-{cid}", hypothesis="h", surface="s")


def statuses(queue: ReviewQueue) -> list[tuple[str, str]]:
    return [(e.candidate_id, e.status) for e in queue.entries()]


def test_recorded_and_waiting_candidates_are_pending_first() -> None:
    view, reviewer = RunView(), FakeReviewer()
    view.apply_all(
        [requested("a"), requested("b"), ReviewDecided(candidate_id="a", decision="pin")]
    )
    reviewer.wait_on("c")
    queue = ReviewQueue(view, reviewer)
    assert statuses(queue) == [("b", "pending"), ("c", "pending"), ("a", "pin")]
    assert [e.candidate_id for e in queue.pending()] == ["b", "c"]
    assert [e.candidate_id for e in queue.decided()] == ["a"]
    assert queue.is_waiting("c") and not queue.is_waiting("b")


def test_a_recorded_entry_keeps_its_diff_and_a_decided_one_waiting_again_is_pending() -> None:
    view, reviewer = RunView(), FakeReviewer()
    view.apply_all(
        [requested("a"), requested("b"), ReviewDecided(candidate_id="b", decision="pin")]
    )
    reviewer.wait_on("a")
    reviewer.wait_on("b")  # asked again after a resume
    queue = ReviewQueue(view, reviewer)
    by_id = {e.candidate_id: e for e in queue.entries()}
    assert by_id["a"].diff == "-a"  # recorded, still pending: the view's entry
    assert (by_id["b"].status, by_id["b"].diff) == ("pending", "+b")  # the reviewer's item


def test_sync_reports_arrivals_once_and_wake_forces_a_report() -> None:
    view, reviewer = RunView(), FakeReviewer()
    queue = ReviewQueue(view, reviewer)
    assert queue.sync() == (False, [])
    reviewer.wait_on("b")
    reviewer.wait_on("a")
    assert queue.sync() == (True, ["a", "b"])
    assert queue.live_ids == {"a", "b"}
    assert queue.sync() == (False, [])
    queue.wake()
    assert queue.sync() == (True, [])
    assert queue.sync() == (False, [])


def test_a_sent_decision_shows_until_the_recorded_one_arrives() -> None:
    view, reviewer = RunView(), FakeReviewer()
    view.apply(requested("a"))
    reviewer.wait_on("a")
    queue = ReviewQueue(view, reviewer)
    queue.sync()
    assert queue.decide("a", ReviewDecision("reject", reason="too broad"))
    assert reviewer.decisions == [("a", "reject")]
    assert queue.live_ids == set()
    (entry,) = queue.entries()
    assert (entry.status, entry.reason) == ("reject", "sent")
    decided = ReviewDecided(candidate_id="a", decision="reject", reason="too broad", by="tui")
    view.apply(decided)
    queue.observe([decided])
    (entry,) = queue.entries()
    assert (entry.status, entry.reason, entry.by) == ("reject", "too broad", "tui")


def test_deciding_what_no_longer_waits_changes_nothing() -> None:
    view, reviewer = RunView(), FakeReviewer()
    view.apply(requested("a"))
    queue = ReviewQueue(view, reviewer)
    assert not queue.decide("a", ReviewDecision("approve"))
    assert statuses(queue) == [("a", "pending")]


def test_a_fresh_reviewer_keeps_what_was_sent() -> None:
    view, first = RunView(), FakeReviewer()
    view.apply(requested("a"))
    first.wait_on("a")
    queue = ReviewQueue(view, first)
    queue.decide("a", ReviewDecision("approve"))
    second = FakeReviewer()
    second.wait_on("b")
    queue.attach(second)
    assert statuses(queue) == [("b", "pending"), ("a", "approve")]
    assert queue.item("b") is not None and queue.item("a") is None


def test_only_the_latest_decisions_are_listed_newest_first() -> None:
    view = RunView()
    n = MAX_DECIDED + 5
    for i in range(n):
        view.apply_all([requested(f"c{i}"), ReviewDecided(candidate_id=f"c{i}", decision="pin")])
    queue = ReviewQueue(view, FakeReviewer())
    ids = [e.candidate_id for e in queue.entries()]
    assert ids == [f"c{i}" for i in range(n - 1, n - 1 - MAX_DECIDED, -1)]
