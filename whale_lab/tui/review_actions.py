"""Review from the TUI: approve, reject (with a reason), edit in $EDITOR, or pin a candidate;
read its review pack (the proposer's transcript, paired traces against the incoming harness);
write a steer note for the next proposer session.

Decisions work on the candidate selected on the review tab, and only while the engine waits
on it; the `ReviewQueue` answers that and records what was sent. Steer notes travel as a
`steer` command, so the engine records them (`SteerNoted`) at its next safe point.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import SuspendNotSupported

from whale_lab.config import Config
from whale_lab.events import Event
from whale_lab.seams import Command, CommandChannel, ReviewDecision
from whale_lab.tui import pack_render
from whale_lab.tui.keys import effective_keys
from whale_lab.tui.review_pack import PackCache, ReviewPack, paired_traces
from whale_lab.tui.review_queue import ReviewQueue
from whale_lab.tui.screens import PairedTraceScreen, ReasonScreen, SteerScreen, TranscriptScreen
from whale_lab.tui.state import ReviewEntry, RunView
from whale_lab.tui.terminal import TerminalGuard
from whale_lab.tui.widgets import ReviewPanel

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[int]
else:
    _AppBase = object

#: Actions on the review tab that read the pack or steer, not decide.
PACK_ACTIONS = ("transcript", "open_pair", "steer")

#: Where a steer note goes, by `proposer.kind`.
STEER_ROUTES = {
    "llm": "The LLM proposer gets it in the system message of its next session.",
    "manual": "The manual proposer gets it as inbox/STEER.md for the person writing candidates.",
}


class ReviewActions(_AppBase):
    """The app's review actions (a `WhaleLabApp` mixin)."""

    reviews: ReviewQueue
    terminal_guard: TerminalGuard | None
    cfg: Config
    view: RunView
    commands: CommandChannel
    keymap: dict[str, str]
    run_root: Path | None

    if TYPE_CHECKING:

        def _q(self, selector: Any, expect_type: Any = None) -> Any: ...

        def _refresh(self, changed: set[str], rebuild: bool = False) -> None: ...

        def _notice(self, level: str, message: str) -> None: ...

        def _refuse(self, action: str) -> None: ...

        @property
        def engine_running(self) -> bool: ...

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

    def review_applies(self, action: str = "approve") -> bool:
        """Decisions: whether the engine waits on the selected candidate. The pack's actions:
        whether there is a transcript or a paired task to open; a steer note: whether an engine
        runs to record it."""
        if action == "steer":
            return self.engine_running and not self.commands.stop_requested.is_set()
        if action in ("transcript", "open_pair"):
            pack = self._selected_pack()
            if pack is None:
                return False
            return pack.transcript is not None if action == "transcript" else bool(pack.changed)
        cid = self._selected_review()
        return cid is not None and self.reviews.is_waiting(cid)

    def review_refusal(self, action: str) -> str:
        """Why a review action does not apply now, in words."""
        if action == "steer":
            return "no engine is running to record it; resume the run first"
        if action == "transcript":
            return "the selected candidate has no proposer transcript (not an LLM proposer)"
        if action == "open_pair":
            return "no paired task that changed is selected"
        return "no candidate is waiting for a decision"

    # ------------------------------------------------------------------ the review pack

    @property
    def _packs(self) -> PackCache:
        cache = self.__dict__.get("_pack_cache")
        if cache is None:
            cache = self.__dict__["_pack_cache"] = PackCache()
        return cache

    def review_pack(self, entry: ReviewEntry) -> ReviewPack:
        """The pack of a review entry (the review panel asks for it when it shows one)."""
        return self._packs.get(self.run_root, entry.candidate_id, entry.diff)

    def binding_key(self, binding_id: str) -> str:
        return effective_keys(self.keymap).get(binding_id, "")

    def _selected_pack(self) -> ReviewPack | None:
        try:
            panel = self._q(ReviewPanel)
        except Exception:  # noqa: BLE001 - before mount
            return None
        entry = panel.selected_entry()
        return self.review_pack(entry) if entry is not None else None

    def action_transcript(self) -> None:
        pack = self._selected_pack()
        if pack is None or pack.transcript is None:
            return self._refuse("Transcript")
        where = pack.transcript_path
        if where is not None and self.run_root is not None:
            where = (
                where.relative_to(self.run_root) if where.is_relative_to(self.run_root) else where
            )
        self.push_screen(
            TranscriptScreen(
                pack.transcript, f" proposer session of {pack.candidate_id} · {where or ''}"
            )
        )

    def action_open_pair(self) -> None:
        pack = self._selected_pack()
        try:
            pair = self._q(ReviewPanel).selected_pair()
        except Exception:  # noqa: BLE001 - before mount
            pair = None
        if pack is None or pair is None:
            return self._refuse("Open paired traces")
        left, right = paired_traces(pack, pair.task_id)
        source = "scored" if pack.source == "scored" else "smoke run"
        self.push_screen(
            PairedTraceScreen(
                left,
                right,
                (
                    f" {pair.task_id}: {pack.candidate_id} {pair.change} it "
                    f"({pair.incoming:.2f} -> {pair.candidate:.2f})",
                    f"incoming {pack.incoming_id} · reward {pair.incoming:.2f}",
                    f"candidate {pack.candidate_id} ({source}) · reward {pair.candidate:.2f}",
                ),
            )
        )

    # ------------------------------------------------------------------ steer notes

    @property
    def steer_sent(self) -> dict[str, str]:
        """Notes sent from here whose `SteerNoted` has not arrived yet: id -> text."""
        sent = self.__dict__.get("_steer_sent")
        if sent is None:
            sent = self.__dict__["_steer_sent"] = {}
        return sent

    def observe_steer(self, events: list[Event]) -> None:
        for ev in events:
            if getattr(ev, "type", "") == "steer_noted":
                self.steer_sent.pop(str(getattr(ev, "note_id", "")), None)

    def action_steer(self) -> None:
        if not self.review_applies("steer"):
            return self._refuse("Steer note")
        from whale_lab.search.steering import new_note_id

        kind = self.cfg.proposer.kind
        route = STEER_ROUTES.get(
            kind,
            f"proposer.kind = {kind!r}: recorded with its outcome, but this proposer does not "
            "read notes (shown as not applicable).",
        )
        history = pack_render.steer_history(
            list(self.view.steer_notes.values()), self.steer_sent, self.view.candidates
        )

        def got(text: str | None) -> None:
            if not text:
                return
            note_id = new_note_id()
            self.steer_sent[note_id] = text
            self.commands.send(Command("steer", by="tui", args={"text": text, "note_id": note_id}))
            self.notify(
                f"Steer note {note_id} sent; the engine records it at its next safe point.",
                title="steer",
                markup=False,
            )
            self._refresh({"reviews"})

        self.push_screen(SteerScreen(route, history), got)

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
