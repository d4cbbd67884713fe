"""Command palette provider: the review and phase-control actions, only those that apply now."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from textual.command import DiscoveryHit, Hit, Hits, Provider

if TYPE_CHECKING:
    from whale_lab.tui.app import WhaleLabApp

#: (action, title, help) for every palette command.
PALETTE_COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("approve", "Review: approve candidate", "Accept the selected candidate for scoring"),
    ("reject", "Review: reject candidate", "Reject the selected candidate, with a reason"),
    ("edit", "Review: edit in $EDITOR, then approve", "Change the candidate's code first"),
    ("pin", "Review: pin candidate as accepted", "Accept it as the phase's harness"),
    ("transcript", "Review: read the proposer's transcript", "Requests, replies, tool calls"),
    ("open_pair", "Review: paired traces of the selected task", "Incoming and candidate"),
    ("steer", "Review: write a steer note", "A request for the next proposer session"),
    ("pause", "Control: pause the engine", "Pause at the next safe point"),
    ("resume", "Control: resume", "Resume a paused engine or an interrupted run"),
    ("switch", "Control: switch phase now", "End the current phase at the next safe point"),
    ("probe", "Control: run a bottleneck probe", "Measure which component to improve next"),
    ("stop", "Control: stop the run", "Stop at the next safe point (resumable)"),
    ("filter(1)", "Rollouts: next filter", "All, failures, or one stop reason"),
    ("open_trace", "Rollouts: open the selected trace", "Show the full episode"),
    ("help", "Help: key bindings", "List every key and its id"),
)


class WhaleCommands(Provider):
    """Lists the app's actions whose `check_action` says they apply right now."""

    def _commands(self) -> list[tuple[str, str, str]]:
        app: WhaleLabApp = self.app  # type: ignore[assignment]
        return [c for c in PALETTE_COMMANDS if app.action_applies(c[0])]

    async def discover(self) -> Hits:
        app = self.app
        for action, title, help_text in self._commands():
            yield DiscoveryHit(title, partial(app.run_action, action), help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        app = self.app
        for action, title, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(
                    score, matcher.highlight(title), partial(app.run_action, action), help=help_text
                )
