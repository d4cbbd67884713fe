"""The typed run state reads and writes `state.json` exactly as the engine always wrote it."""

from __future__ import annotations

import json
from pathlib import Path

from whale_lab.engine.state import PhaseRecord, RunState

FIXTURE = Path(__file__).parent / "fixtures" / "golden" / "state.json"


def test_a_state_json_written_before_the_split_round_trips_unchanged() -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    state = RunState.from_dict(data)
    assert isinstance(state.phases[0], PhaseRecord)
    assert state.to_dict() == data
    assert json.loads(json.dumps(state.to_dict())) == data


def test_the_fixture_covers_the_optional_keys() -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    state = RunState.from_dict(data)
    assert state.kept_weights_at is not None and state.switches and state.probes
    weight, harness = state.phases[0], state.phases[1]
    assert weight.switch is not None and weight.start_step is not None and weight.dir is None
    assert harness.dir and harness.accepted and harness.pending == []
    assert "dir" not in weight.to_dict() and "start_step" not in harness.to_dict()


def test_unknown_keys_are_kept_and_absent_optionals_stay_absent() -> None:
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    data["from_a_later_version"] = {"x": 1}
    data["phases"][0]["note"] = "kept"
    del data["kept_weights_at"], data["updated"]
    out = RunState.from_dict(data).to_dict()
    assert out == data
    assert "kept_weights_at" not in out and "updated" not in out


def test_record_lookup_and_pending() -> None:
    state = RunState.from_dict(json.loads(FIXTURE.read_text(encoding="utf-8")))
    assert state.record(1).kind == "harness"
    state.record(1).pending = ["c003"]
    assert state.pending() == ["c003"]
