"""Review from the TUI: approve, reject (with a reason), edit in $EDITOR, or pin a candidate.

Every action works on the candidate selected on the review tab, and only while the engine waits
on it; the `ReviewQueue` answers that and records what was sent.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import SuspendNotSupported

from whale_lab.seams import ReviewDecision
from whale_lab.tui.review_queue import ReviewQueue
from whale_lab.tui.screens import ReasonScreen
from whale_lab.tui.state import ReviewEntry
from whale_lab.tui.terminal import TerminalGuard
from whale_lab.tui.widgets import ReviewPanel

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[int]
else:
    _AppBase = object


class ReviewActions(_AppBase):
    """The app's review actions (a `WhaleLabApp` mixin)."""

    reviews: ReviewQueue
    terminal_guard: TerminalGuard | None

    if TYPE_CHECKING:

        def _q(self, selector: Any, expect_type: Any = None) -> Any: ...

        def _refresh(self, changed: set[str], rebuild: bool = False) -> None: ...

        def _notice(self, level: str, message: str) -> None: ...

        def _refuse(self, action: str) -> None: ...

    def review_entries(self) -> list[ReviewEntry]:
        """Pending (live or recorded) first, then the 20 latest decisions, newest first."""
        return self.reviews.entries()

    def _on_review_request(self, item: object) -> None:
        """Engine thread: a candidate waits; the next flush shows it."""
        self.reviews.wake()

    def _selected_review(self) -> str | None:
        try:
            return self._q(ReviewPanel).selected_id()
        except Exception:  # noqa: BLE001 - before mount
            return None

    def review_applies(self) -> bool:
        """Whether the selected candidate is one the engine waits on."""
        cid = self._selected_review()
        return cid is not None and self.reviews.is_waiting(cid)

    def _decide(self, cid: str, decision: ReviewDecision) -> None:
        if self.reviews.decide(cid, decision):
            self._notice("info", f"{decision.decision} {cid}")
            self.notify(f"{cid}: {decision.decision}", title="review", markup=False)
        else:
            self.notify(
                f"{cid} is no longer waiting for a decision.", severity="warning", markup=False
            )
        self._refresh({"reviews", "status", "control"})

    def _review_target(self, action: str) -> str | None:
        cid = self._selected_review()
        if cid is None or not self.reviews.is_waiting(cid):
            self._refuse(action)
            return None
        return cid

    def action_approve(self) -> None:
        cid = self._review_target("Approve")
        if cid:
            self._decide(cid, ReviewDecision("approve", reason="approved in review"))

    def action_pin(self) -> None:
        cid = self._review_target("Pin")
        if cid:
            self._decide(cid, ReviewDecision("pin", reason="pinned in review"))

    def action_reject(self) -> None:
        cid = self._review_target("Reject")
        if not cid:
            return

        def got_reason(reason: str | None) -> None:
            if reason:
                self._decide(cid, ReviewDecision("reject", reason=reason))

        self.push_screen(ReasonScreen(f"Reject {cid}: why?"), got_reason)

    def action_edit(self) -> None:
        cid = self._review_target("Edit")
        if not cid:
            return
        item = self.reviews.item(cid)
        if item is None:
            return self._refuse("Edit")
        editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            self.notify(
                "Set $EDITOR (or $VISUAL) to edit a candidate.", severity="error", markup=False
            )
            return
        with tempfile.TemporaryDirectory(prefix="whale-lab-edit-") as tmp:
            path = Path(tmp) / f"{cid}.py"
            path.write_text(item.code, encoding="utf-8")
            try:
                rc = self._run_editor([*shlex.split(editor), str(path)])
            except (OSError, ValueError) as exc:
                self.notify(
                    f"Could not start the editor {editor!r}: {exc}", severity="error", markup=False
                )
                return
            new_code = path.read_text(encoding="utf-8")
        if rc != 0:
            self.notify(
                f"The editor exited with status {rc}; nothing was decided.",
                severity="warning",
                markup=False,
            )
            return
        if new_code == item.code:
            self.notify(
                "No changes made; approve (a) takes it as it is.", severity="warning", markup=False
            )
            return
        self._decide(cid, ReviewDecision("edit", reason="edited in review", edited_code=new_code))

    def _run_editor(self, argv: list[str]) -> int:
        guard = self.terminal_guard
        try:
            with self.suspend():
                if guard is not None:
                    with guard.terminal():
                        return subprocess.call(argv)
                return subprocess.call(argv)
        except SuspendNotSupported:
            # headless (tests): no terminal to hand over
            return subprocess.call(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
