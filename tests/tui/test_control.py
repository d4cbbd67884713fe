"""Which control actions apply: the TUI asks the engine's `applicable_commands`, plus its extras.

`legacy_applies` and `legacy_why_not` are the rules the app used to derive itself; every
combination of the inputs must give the same answer through the engine's rules.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from whale_lab.engine.safepoints import COMMANDS, ControlState, applicable_commands
from whale_lab.tui.control import (
    CONTROL_ACTIONS,
    ControlInputs,
    applicable_controls,
    refusal_reason,
)

FLAGS = (
    "engine_running",
    "exiting",
    "stop_requested",
    "view_stopping",
    "view_paused",
    "pause_sent",
    "pause_applied",
    "switch_sent",
    "phase_active",
    "probe_running",
    "probe_sent",
    "can_resume_run",
)
PHASES = ("", "weight", "harness", "eval", "probe")


def every_input() -> Iterator[ControlInputs]:
    for values in itertools.product((False, True), repeat=len(FLAGS)):
        for phase in PHASES:
            yield ControlInputs(phase=phase, **dict(zip(FLAGS, values, strict=True)))


def legacy_applies(name: str, c: ControlInputs) -> bool:
    """The app's own rules before it asked `applicable_commands`."""
    running = c.engine_running and not c.exiting
    stopping = c.stop_requested or c.view_stopping
    paused = c.view_paused or c.pause_sent
    if name == "pause":
        return running and not stopping and not paused
    if name == "resume":
        return (running and paused and not stopping) or c.can_resume_run
    if name == "switch":
        return (
            running
            and not stopping
            and c.phase_active
            and c.phase in ("weight", "harness")
            and not c.switch_sent  # a switch sent and not yet acted on is not sent twice
        )
    if name == "probe":
        return running and not stopping and not c.probe_running and not c.probe_sent
    if name == "stop":
        return running and not stopping
    raise AssertionError(name)


def legacy_why_not(action: str, c: ControlInputs) -> str:
    if not c.engine_running:
        return "no engine is running" if action != "resume" else "nothing to resume"
    if c.stop_requested or c.view_stopping:
        return "the engine is stopping"
    if action == "switch" and c.switch_sent:
        return "a switch is already requested"
    return {
        "pause": "already paused",
        "resume": "not paused",
        "probe": "a probe is already running",
        "switch": "no weight or harness phase is running",
    }.get(action, "not in this state")


def test_the_control_actions_are_the_engine_commands() -> None:
    assert CONTROL_ACTIONS == COMMANDS == ("pause", "resume", "switch", "probe", "stop")


def test_every_combination_allows_and_refuses_as_before() -> None:
    checked = 0
    for c in every_input():
        new = applicable_controls(c)
        for name in CONTROL_ACTIONS:
            assert (name in new) == legacy_applies(name, c), (name, c)
            checked += 1
    assert checked == 2 ** len(FLAGS) * len(PHASES) * len(CONTROL_ACTIONS)


def test_every_refusal_reason_is_as_before() -> None:
    for c in every_input():
        for name in CONTROL_ACTIONS:
            assert refusal_reason(name, c) == legacy_why_not(name, c), (name, c)


def test_the_engine_rules_decide_while_an_engine_runs() -> None:
    """Without the TUI's extras (no run folder to resume, a weight phase) the answer is exactly
    the engine's `applicable_commands` on the state the TUI built."""
    for c in every_input():
        if c.can_resume_run or c.phase != "weight":
            continue
        assert applicable_controls(c) == applicable_commands(c.control_state()), c


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ({}, {"pause", "switch", "probe", "stop"}),
        ({"pause_sent": True}, {"resume", "switch", "probe", "stop"}),
        ({"probe_sent": True}, {"pause", "switch", "stop"}),
        ({"switch_sent": True}, {"pause", "probe", "stop"}),
        ({"stop_requested": True}, set()),
        ({"exiting": True}, set()),
    ],
)
def test_commands_sent_count_before_they_are_acknowledged(
    sent: dict[str, bool], expected: set[str]
) -> None:
    base = dict.fromkeys(FLAGS, False) | {"engine_running": True, "phase_active": True}
    c = ControlInputs(phase="harness", **(base | sent))
    assert applicable_controls(c) == expected


def test_the_state_handed_to_the_engine_rules() -> None:
    c = ControlInputs(
        engine_running=True,
        exiting=False,
        stop_requested=False,
        view_stopping=False,
        view_paused=False,
        pause_sent=True,
        pause_applied=False,
        switch_sent=False,
        phase_active=True,
        phase="weight",
        probe_running=False,
        probe_sent=True,
        can_resume_run=False,
    )
    assert c.control_state() == ControlState(
        live=True,
        paused=True,
        stopping=False,
        phase_active=True,
        switch_pending=False,
        probing=False,
        probe_pending=True,
    )


def test_a_stopped_run_folder_can_only_be_resumed() -> None:
    base = dict.fromkeys(FLAGS, False) | {"can_resume_run": True}
    assert applicable_controls(ControlInputs(phase="", **base)) == {"resume"}
