"""ThreadReviewer: the engine thread blocks until the UI decides; a stop always releases it."""

from __future__ import annotations

import threading

import pytest

from whale_lab.reviewers import ThreadReviewer
from whale_lab.seams import Command, CommandChannel, ReviewDecision, ReviewItem

ITEM = ReviewItem(
    candidate_id="c1", diff="-a\n+b\n", hypothesis="h", surface="prompts", code="X = 1\n"
)


def review_in_thread(reviewer: ThreadReviewer, item: ReviewItem = ITEM):
    out: list[ReviewDecision] = []
    t = threading.Thread(target=lambda: out.append(reviewer.review(item)))
    t.start()
    return t, out


def wait_pending(reviewer: ThreadReviewer, cid: str = "c1") -> None:
    for _ in range(500):
        if reviewer.is_waiting(cid):
            return
        threading.Event().wait(0.01)
    raise AssertionError("review never arrived")


def test_blocks_until_decided() -> None:
    seen: list[str] = []
    reviewer = ThreadReviewer(
        CommandChannel(), on_request=lambda item: seen.append(item.candidate_id), poll_s=0.01
    )
    t, out = review_in_thread(reviewer)
    wait_pending(reviewer)
    assert seen == ["c1"] and [i.candidate_id for i in reviewer.pending()] == ["c1"]
    assert t.is_alive()
    assert reviewer.decide("c1", ReviewDecision("reject", reason="too broad"))
    t.join(5)
    assert out == [ReviewDecision("reject", reason="too broad")]
    assert reviewer.pending() == []
    assert not reviewer.decide("c1", ReviewDecision("approve"))  # nothing waits any more


def test_stop_request_releases_with_pending() -> None:
    commands = CommandChannel()
    reviewer = ThreadReviewer(commands, poll_s=0.01)
    t, out = review_in_thread(reviewer)
    wait_pending(reviewer)
    commands.send(Command("stop"))
    t.join(5)
    assert not t.is_alive() and out[0].decision == "pending"
    assert reviewer.pending() == []
    # once stopping, a new review returns at once
    assert reviewer.review(ITEM).decision == "pending"


def test_close_releases_with_pending() -> None:
    reviewer = ThreadReviewer(None, poll_s=0.01)
    t, out = review_in_thread(reviewer)
    wait_pending(reviewer)
    reviewer.close()
    t.join(5)
    assert out[0].decision == "pending" and reviewer.closed


def test_decisions_are_checked() -> None:
    reviewer = ThreadReviewer(CommandChannel())
    with pytest.raises(ValueError, match="expected one of approve, reject, edit, pin"):
        reviewer.decide("c1", ReviewDecision("pending"))
    with pytest.raises(ValueError, match="needs edited_code"):
        reviewer.decide("c1", ReviewDecision("edit"))


def test_a_failing_on_request_does_not_break_the_engine() -> None:
    def boom(item: ReviewItem) -> None:
        raise RuntimeError("ui gone")

    reviewer = ThreadReviewer(CommandChannel(), on_request=boom, poll_s=0.01)
    t, out = review_in_thread(reviewer)
    wait_pending(reviewer)
    reviewer.decide("c1", ReviewDecision("edit", edited_code="X = 2\n"))
    t.join(5)
    assert out[0].edited_code == "X = 2\n"
