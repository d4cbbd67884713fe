"""Phase control from the TUI: which of pause/resume/switch/probe/stop apply, and the actions.

The rules live in the engine's `applicable_commands`; the TUI only builds a `ControlState` from
what it knows (the event stream, plus commands it sent whose `CommandReceived` has not arrived
yet) and adds what is about the TUI alone: resuming a finished or stopped run folder, and
switching only out of a weight or harness phase.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text

from whale_lab.engine.safepoints import COMMANDS, ControlState, applicable_commands
from whale_lab.events import Event
from whale_lab.seams import Command, CommandChannel
from whale_lab.tui import render
from whale_lab.tui.screens import ConfirmScreen
from whale_lab.tui.state import RunView

if TYPE_CHECKING:
    from textual.app import App

    from whale_lab.reviewers import ThreadReviewer

    _AppBase = App[int]
else:
    _AppBase = object

CONTROL_ACTIONS: tuple[str, ...] = COMMANDS
#: Phases a switch can end (an evaluation or a probe runs to its end).
SWITCH_PHASES = ("weight", "harness")


@dataclass(frozen=True)
class ControlInputs:
    """Everything the TUI knows that decides whether a control action applies."""

    engine_running: bool  # the engine worker is pending or running
    exiting: bool  # the app is quitting
    stop_requested: bool  # the command channel carries a stop
    view_stopping: bool  # the event stream acknowledged a stop
    view_paused: bool  # the event stream says paused
    pause_sent: bool  # a pause was sent and no resume or stop acknowledged since
    pause_applied: bool  # the engine says it paused (CommandApplied), no resume or stop since
    switch_sent: bool  # a switch was sent and the engine has not acted on it yet
    phase_active: bool
    phase: str
    probe_running: bool  # the event stream acknowledged a probe, no result yet
    probe_sent: bool  # a probe was sent and its result has not arrived
    can_resume_run: bool  # no engine, and the run folder can be continued

    @property
    def stopping(self) -> bool:
        return self.stop_requested or self.view_stopping

    @property
    def paused(self) -> bool:
        return self.view_paused or self.pause_sent

    @property
    def pausing(self) -> bool:
        """A pause was asked for and the engine has not reached a safe point to take it."""
        return self.paused and not self.pause_applied

    def control_state(self) -> ControlState:
        """The engine's view of the command state, as far as the TUI can tell."""
        return ControlState(
            live=self.engine_running and not self.exiting,
            paused=self.paused,
            stopping=self.stopping,
            phase_active=self.phase_active,
            switch_pending=self.switch_sent,
            probing=self.probe_running,
            probe_pending=self.probe_sent,
        )


def applicable_controls(c: ControlInputs) -> frozenset[str]:
    """The control actions that do something now: the engine's rules plus the TUI's own."""
    out = set(applicable_commands(c.control_state()))
    if c.phase not in SWITCH_PHASES:
        out.discard("switch")
    if c.can_resume_run:
        out.add("resume")
    return frozenset(out)


def refusal_reason(action: str, c: ControlInputs) -> str:
    """Why a control action does not apply, in a few words for a notification."""
    if not c.engine_running:
        return "no engine is running" if action != "resume" else "nothing to resume"
    if c.stopping:
        return "the engine is stopping"
    if action == "pause":
        return "already paused"
    if action == "resume":
        return "not paused"
    if action == "probe":
        return "a probe is already running"
    if action == "switch":
        if c.switch_sent:
            return "a switch is already requested"
        return "no weight or harness phase is running"
    return "not in this state"


class ControlActions(_AppBase):
    """The app's control actions and the state badge that follows them (a `WhaleLabApp` mixin)."""

    view: RunView
    commands: CommandChannel
    reviewer: ThreadReviewer
    run_root: Path | None
    engine_error: str
    _exiting: bool
    _pause_sent: bool
    _probe_sent: bool
    _switch_sent: bool
    _starts_at_launch: int
    read_only_pid: int | None

    if TYPE_CHECKING:

        @property
        def engine_running(self) -> bool: ...

        def start_engine(self) -> None: ...

        def action_applies(self, action: str) -> bool: ...

        def _refresh(self, changed: set[str], rebuild: bool = False) -> None: ...

        def _notice(self, level: str, message: str) -> None: ...

        def _refuse(self, action: str) -> None: ...

    # ------------------------------------------------------------------ state

    def control_inputs(self) -> ControlInputs:
        return ControlInputs(
            engine_running=self.engine_running,
            exiting=self._exiting,
            stop_requested=self.commands.stop_requested.is_set(),
            view_stopping=self.view.stopping,
            view_paused=self.view.paused,
            pause_sent=self._pause_sent,
            pause_applied=self.view.activity.paused,
            switch_sent=self._switch_sent,
            phase_active=self.view.phase_active,
            phase=self.view.phase,
            probe_running=self.view.probe_running,
            probe_sent=self._probe_sent,
            can_resume_run=self.can_resume_run(),
        )

    def applicable_controls(self) -> frozenset[str]:
        return applicable_controls(self.control_inputs())

    def can_resume_run(self) -> bool:
        return (
            not self.engine_running
            and self.read_only_pid is None
            and not self._exiting
            and self.run_root is not None
            and self.view.event_count > 0
            and self.view.finished != "completed"
        )

    def _forget_sent(self) -> None:
        """A fresh engine has seen none of the commands sent to the last one."""
        self._pause_sent = self._probe_sent = self._switch_sent = False

    def _control_events(self, batch: Iterable[Event]) -> None:
        """Acknowledgements in the event stream settle the commands sent from here."""
        for ev in batch:
            kind = getattr(ev, "type", "")
            if kind == "probe_result":
                self._probe_sent = False
                self.notify(
                    f"Probe: {getattr(ev, 'recommendation', '')}",
                    title="probe",
                    markup=False,
                    timeout=10,
                )
            if kind == "command_received" and getattr(ev, "command", "") in ("resume", "stop"):
                self._pause_sent = False
            if kind == "command_received" and getattr(ev, "command", "") == "stop":
                self._switch_sent = False
            if kind == "phase_ended":
                self._switch_sent = False
            if kind == "command_applied":
                self._command_applied(
                    str(getattr(ev, "command", "")), str(getattr(ev, "detail", ""))
                )

    def _command_applied(self, command: str, detail: str) -> None:
        """The engine acted on a command: say so, and stop showing it as pending."""
        if command == "switch":
            self._switch_sent = False
            self.notify(f"Switched: {detail}.", title="switch", markup=False)
        elif command == "pause" and not self._exiting:
            self.notify("Paused at a safe point. Resume with g.", title="pause", markup=False)
        elif command == "resume" and not self._exiting:
            self.notify("Resumed.", title="pause", markup=False, timeout=3)

    def display_state(self) -> str:
        """The header badge: live engine state, or what the run folder says."""
        if self.engine_running:
            c = self.control_inputs()
            if c.stopping:
                return "stopping"
            if c.pausing:
                return "pausing"
            if c.paused:
                return "paused"
            if self.view.starts == self._starts_at_launch:
                return "starting"  # loading the model; no RunStarted from this engine yet
            return self.view.finished or "running"
        if self.engine_error:
            return "failed"
        if self.read_only_pid is not None:
            return "read-only"
        if self.view.finished:
            return self.view.finished
        return "replay" if self.view.event_count else "waiting"

    def _control_state_text(self) -> Text:
        t = Text()
        state = self.display_state()
        t.append(f" {state.upper()} ", style=f"reverse {render.STATE_STYLE.get(state, 'bold')}")
        c = self.control_inputs()
        if self.engine_running and c.stopping:
            t.append("  stop requested: the engine stops at its next safe point", style="dim")
        elif self.engine_running and c.pausing:
            t.append("  pause requested: the engine pauses at its next safe point", style="dim")
        elif self.engine_running and c.paused:
            t.append("  the engine is paused at a safe point; resume (g) goes on", style="dim")
        elif self.engine_running:
            t.append("  engine running in the background", style="dim")
        elif self.read_only_pid is not None:
            t.append(f"  read-only: this run is open in process {self.read_only_pid}", style="dim")
        elif self.can_resume_run():
            t.append("  no engine: resume (g) continues this run from its folder", style="dim")
        else:
            t.append("  no engine attached", style="dim")
        if self._switch_sent:
            t.append("\nswitch requested: the phase ends at its next safe point", style="yellow")
        if self.engine_error:
            t.append(f"\nlast error: {self.engine_error}", style="red")
        if self.view.commands:
            t.append("\ncommands: " + ", ".join(list(self.view.commands)[-6:]), style="dim")
        return t

    # ------------------------------------------------------------------ actions

    def _send(self, kind: str, reason: str = "") -> None:
        self.commands.send(Command(kind, by="tui", reason=reason))  # type: ignore[arg-type]
        self._notice("info", f"sent {kind}")

    def action_pause(self) -> None:
        if not self.action_applies("pause"):
            return self._refuse("Pause")
        self._pause_sent = True
        self._send("pause")
        self.notify(
            "Pause requested: the engine pauses at its next safe point.", markup=False, timeout=3
        )
        self._refresh({"status", "control"})

    def action_resume(self) -> None:
        if not self.action_applies("resume"):
            return self._refuse("Resume")
        if self.engine_running:
            self._pause_sent = False
            self._send("resume")
        else:
            self._notice("info", f"resuming run {self.run_root}")
            self.start_engine()
        self._refresh({"status", "control"})

    def action_switch(self) -> None:
        if not self.action_applies("switch"):
            return self._refuse("Switch phase")
        self._switch_sent = True
        self._send("switch", reason=f"end the {self.view.phase} phase now")
        self.notify(
            f"Switch requested: the {self.view.phase} phase ends at its next safe point.",
            markup=False,
        )
        self._refresh({"status", "control"})

    def action_probe(self) -> None:
        if not self.action_applies("probe"):
            return self._refuse("Probe")
        self._probe_sent = True
        self._send("probe")
        self.notify("Probe requested: it runs at the next safe point.", markup=False)
        self._refresh({"control"})

    def action_stop(self) -> None:
        if not self.action_applies("stop"):
            return self._refuse("Stop")

        def answered(yes: bool | None) -> None:
            if yes and self.action_applies("stop"):
                self._send("stop", reason="stop from the TUI")
                self.reviewer.close()
                self._refresh({"status", "control", "reviews"})

        self.push_screen(
            ConfirmScreen("Stop the run at the next safe point? It can be resumed later."),
            answered,
        )
