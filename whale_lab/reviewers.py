"""Every reviewer in one place: automatic, in a terminal, and handed over from another thread.

A reviewer answers the engine's `Reviewer.review(ReviewItem)` seam. `AutoReviewer` approves all
(headless runs, tests), `TerminalReviewer` asks on stdin (`whale-lab search` in a terminal), and
`ThreadReviewer` blocks the engine thread until another thread (the app's UI thread) decides; a stop
request or `close()` releases every waiting review as "pending", so quitting never hangs and the
candidate is asked for again when the run resumes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from whale_lab.seams import CommandChannel, ReviewDecision, ReviewItem


class AutoReviewer:
    def review(self, item: ReviewItem) -> ReviewDecision:
        return ReviewDecision("approve", reason="auto", by="auto")


class TerminalReviewer:
    """Shows a candidate's hypothesis and diff; reads approve / reject / edit / pin / later."""

    def __init__(
        self, stdin: TextIO | None = None, stdout: TextIO | None = None, editor: str | None = None
    ) -> None:
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        self.editor = editor

    def _ask(self, prompt: str) -> str:
        self.stdout.write(prompt)
        self.stdout.flush()
        line = self.stdin.readline()
        if not line:
            raise EOFError
        return line.strip()

    def _show(self, item: ReviewItem) -> None:
        from rich.console import Console
        from rich.syntax import Syntax

        console = Console(file=self.stdout, highlight=False)
        smoke = "-" if item.smoke_success is None else f"{item.smoke_success:.0%}"
        console.rule(f"review {item.candidate_id}  surface: {item.surface or '-'}  smoke: {smoke}")
        console.print(item.hypothesis, markup=False)
        console.print(Syntax(item.diff or "(no change)", "diff", word_wrap=True))

    def review(self, item: ReviewItem) -> ReviewDecision:
        self._show(item)
        try:
            while True:
                answer = self._ask("[a]pprove  [r]eject  [e]dit  [p]in  [l]ater > ").lower()
                if answer in ("a", "approve", "y", "yes"):
                    return ReviewDecision("approve", by="human")
                if answer in ("p", "pin"):
                    return ReviewDecision("pin", reason="pinned at review", by="human")
                if answer in ("l", "later", "q", "quit"):
                    return ReviewDecision("pending", reason="left for later", by="human")
                if answer in ("r", "reject", "n", "no"):
                    reason = ""
                    while not reason:
                        reason = self._ask("reason (the proposer reads it): ")
                    return ReviewDecision("reject", reason=reason, by="human")
                if answer in ("e", "edit"):
                    code = self._edit(item.code)
                    if code is None:
                        self.stdout.write("no editor: set $EDITOR to edit candidates\n")
                        continue
                    return ReviewDecision(
                        "edit", reason="edited at review", edited_code=code, by="human"
                    )
                self.stdout.write("please answer a, r, e, p or l\n")
        except EOFError:
            return ReviewDecision("pending", reason="no answer (end of input)", by="human")

    def _edit(self, code: str) -> str | None:
        import os
        import shlex
        import subprocess
        import tempfile

        editor = self.editor or os.environ.get("VISUAL") or os.environ.get("EDITOR")
        if not editor:
            return None
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, encoding="utf-8") as fh:
            fh.write(code)
            path = fh.name
        try:
            subprocess.run([*shlex.split(editor), path], check=False)
            return Path(path).read_text(encoding="utf-8")
        finally:
            Path(path).unlink(missing_ok=True)


VALID_DECISIONS = ("approve", "reject", "edit", "pin")


@dataclass
class _Slot:
    item: ReviewItem
    done: threading.Event = field(default_factory=threading.Event)
    decision: ReviewDecision | None = None


class ThreadReviewer:
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
