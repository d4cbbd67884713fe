"""Commands handled at safe points: pause, resume, switch, probe, stop; and steer notes.

A front end puts `Command`s on the channel; the engine drains it only at safe points (between
episodes, steps, iterations and phases), so a command never tears a step in half. Which commands
apply in a given state is decided by `applicable_commands` alone; the engine's status and every
front end (the TUI's keys and palette) read it from there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from whale_lab.events import CommandApplied, CommandReceived, Event, Log, SteerNoted
from whale_lab.seams import Command, CommandChannel

COMMANDS = ("pause", "resume", "switch", "probe", "stop")
#: Not phase control: a steer note is recorded (`SteerNoted`) for the next proposer session.
NOTE_COMMANDS = ("steer",)
LIVE_STATES = ("starting", "running", "paused", "probing")


@dataclass(frozen=True)
class ControlState:
    """What decides which commands apply: a snapshot any front end can build."""

    live: bool  # the engine is starting, running, paused or probing
    paused: bool
    stopping: bool
    phase_active: bool
    switch_pending: bool = False
    probing: bool = False
    probe_pending: bool = False


def applicable_commands(s: ControlState) -> frozenset[str]:
    """Commands that do something now (the others would only be logged as ignored)."""
    if not s.live or s.stopping:
        return frozenset()
    out = {"stop", "resume" if s.paused else "pause"}
    if s.phase_active and not s.switch_pending:
        out.add("switch")
    if not s.probing and not s.probe_pending:
        out.add("probe")
    return frozenset(out)


class SafePoints:
    """The command state machine: what was asked, and what the running phase must do about it.

    `validate_probe` checks a probe command's arguments when it arrives (a bad one is ignored
    with a warning); `run_probe` runs a pending probe when a phase has returned to a safe point.
    """

    def __init__(
        self,
        commands: CommandChannel,
        emit: Callable[[Event], None],
        *,
        validate_probe: Callable[[Command], None],
        run_probe: Callable[[], None],
    ) -> None:
        self.commands = commands
        self.emit = emit
        self.validate_probe = validate_probe
        self.run_probe = run_probe
        self.lock = threading.Lock()
        self.state_name = "idle"
        self.phase_active = False
        self.paused = False
        self.stopping = False
        self.stop_by = ""
        self.switch: Command | None = None
        self.probe_request: Command | None = None
        self.in_probe = False
        self.boundary = True  # no episode of the current step or iteration has finished yet
        self.interrupt = ""  # why the phase's should_stop last returned True

    # ------------------------------------------------------------------ state
    def set(self, name: str) -> None:
        with self.lock:
            self.state_name = name

    def control_state(self) -> ControlState:
        return ControlState(
            live=self.state_name in LIVE_STATES,
            paused=self.paused,
            stopping=self.stop_requested(),
            phase_active=self.phase_active,
            switch_pending=self.switch is not None,
            probing=self.in_probe,
            probe_pending=self.probe_request is not None,
        )

    def applicable(self) -> frozenset[str]:
        return applicable_commands(self.control_state())

    def stop_requested(self) -> bool:
        return self.stopping or self.commands.stop_requested.is_set()

    def begin_attempt(self) -> None:
        """A phase's `run` is about to start (again): a fresh step, nothing interrupted yet."""
        self.boundary, self.interrupt = True, ""

    def _log(self, message: str, level: str = "info") -> None:
        self.emit(Log(level=level, message=message))

    # ------------------------------------------------------------------ commands
    def poll(self) -> None:
        for cmd in self.commands.drain():
            self.accept(cmd)

    def accept(self, cmd: Command) -> None:
        kind = cmd.kind
        if kind == "steer":
            self._steer(cmd)
            return
        if kind not in COMMANDS:
            self._log(f"unknown command {kind!r} from {cmd.by} ignored", "warning")
            return
        if kind == "stop":
            if self.stopping:
                return
            self.stopping, self.paused = True, False
            self.stop_by = f"{cmd.by}" + (f" ({cmd.reason})" if cmd.reason else "")
            self.commands.paused.clear()
        elif kind == "pause":
            if self.paused or self.stop_requested():
                self._log(f"pause from {cmd.by} ignored: already paused or stopping", "warning")
                return
            self.paused = True
            self.commands.paused.set()
        elif kind == "resume":
            if not self.paused:
                self._log(f"resume from {cmd.by} ignored: the run is not paused", "warning")
                return
            self.paused = False
            self.commands.paused.clear()
        elif kind == "switch":
            if not self.phase_active or self.switch is not None:
                self._log(f"switch from {cmd.by} ignored: no phase is running now", "warning")
                return
            self.switch = cmd
        elif kind == "probe":
            if self.probe_request is not None or self.in_probe:
                self._log(f"probe from {cmd.by} ignored: a probe is already pending", "warning")
                return
            try:
                self.validate_probe(cmd)
            except ValueError as exc:
                self._log(f"probe from {cmd.by} ignored: {exc}", "warning")
                return
            self.probe_request = cmd
        self.emit(CommandReceived(command=kind, by=cmd.by, reason=cmd.reason))

    def _steer(self, cmd: Command) -> None:
        from whale_lab.search.steering import check_note, new_note_id

        try:
            text = check_note(str(cmd.args.get("text", "")))
        except ValueError as exc:
            self._log(f"steer note from {cmd.by} ignored: {exc}", "warning")
            return
        note_id = str(cmd.args.get("note_id") or new_note_id())
        self.emit(SteerNoted(note_id=note_id, text=text, by=cmd.by))
        self._log(f"steer note {note_id} from {cmd.by}: the next proposer session gets it")

    def take_switch(self) -> Command | None:
        cmd, self.switch = self.switch, None
        return cmd

    # ------------------------------------------------------------------ waiting
    def wait_paused(self, *, wake_for_work: bool = True) -> None:
        """Block while paused; wake for resume or stop, and (unless `wake_for_work` is off,
        as inside an evaluation) for a switch or a probe request."""
        before = self.state_name
        self.set("paused")
        self._log("paused at a safe point")
        self.emit(CommandApplied(command="pause", detail="paused at a safe point"))
        while self.paused and not self.stop_requested():
            if wake_for_work and (self.switch is not None or self.probe_request is not None):
                break
            self.commands.stop_requested.wait(0.05)
            self.poll()
        if not self.paused and not self.stop_requested():
            self._log("resumed")
            self.emit(CommandApplied(command="resume", detail="resumed"))
        self.set(before if before != "paused" else "running")

    # ------------------------------------------------------------------ the phases' hooks
    def interrupt_phase(self) -> bool:
        """The phases' `should_stop`: True ends the phase's `run` at its last safe point."""
        self.poll()
        if self.stop_requested():
            self.interrupt = "stop"
            return True
        if self.switch is not None:
            self.interrupt = "switch"
            return True
        if self.paused:
            self.wait_paused()  # waits here, mid-step, losing nothing
            if self.stop_requested():
                self.interrupt = "stop"
                return True
            if self.switch is not None:
                self.interrupt = "switch"
                return True
            if self.probe_request is not None:
                self.interrupt = "probe"
                return True
            return False
        if self.probe_request is not None and self.boundary:
            self.interrupt = "probe"
            return True
        return False

    def eval_should_stop(self) -> bool:
        """Evaluations stop only for a stop (a pause waits; probes and switches come after)."""
        self.poll()
        if self.paused and not self.stop_requested():
            self.wait_paused(wake_for_work=False)
        return self.stop_requested()

    def probe_should_stop(self) -> bool:
        self.poll()
        return self.stop_requested()

    def after_interrupt(self) -> str:
        """After a phase returned at a safe point: run a probe, wait out a pause, then say
        whether the phase goes on ("continue"), ends ("switch") or the run stops ("stop")."""
        while True:
            self.poll()
            if self.stop_requested():
                return "stop"
            if self.switch is not None:
                return "switch"
            if self.probe_request is not None:
                self.run_probe()
                continue
            if self.paused:
                self.wait_paused()
                continue
            self.interrupt = ""
            return "continue"

    def service(self) -> bool:
        """Between phases: probes and pauses; True when the run must stop."""
        while True:
            self.poll()
            if self.stop_requested():
                return True
            if self.probe_request is not None:
                self.run_probe()
                continue
            if self.paused:
                self.wait_paused()
                continue
            return False
