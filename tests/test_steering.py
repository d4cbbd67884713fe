"""Steer notes: recorded by the engine's safe points, delivered to the next proposer session,
kept in the phase archive with the candidates that session wrote and their scores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.openai_replay_server import ReplayServer, say, tool_call

from whale_lab.config import ProposerConfig
from whale_lab.engine.safepoints import SafePoints
from whale_lab.events import Event, Log, SteerDelivered, SteerNoted
from whale_lab.seams import Command, CommandChannel
from whale_lab.search.archive import INCOMING, PhaseArchive
from whale_lab.search.proposers.base import ProposalRequest
from whale_lab.search.proposers.llm import LLMProposer
from whale_lab.search.proposers.rules import RulesProposer
from whale_lab.search.steering import check_note, open_notes, steered
from whale_lab.store import RunStore

REPO = Path(__file__).resolve().parent.parent
H0 = (REPO / "harnesses" / "search" / "h0.py").read_text(encoding="utf-8")
NEW_CODE = H0 + "\nMAX_TURNS = 3\n"


def _run(tmp_path: Path) -> tuple[RunStore, PhaseArchive]:
    store = RunStore.create(tmp_path / "runs", "steer")
    archive = PhaseArchive(store.root / "harness_phases" / "cycle-01")
    cid = archive.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer=INCOMING, iteration=1
    )
    archive.write_traces(
        cid, [{"task_id": "search-harness-00001", "sample": 0, "reward": 0.0, "turns": []}]
    )
    archive.write_json(cid, "scores", {"success_rate": 0.0, "mean_turns": 2.0, "rollouts": 1})
    archive.set_status(cid, "evaluated")
    archive.write_summary()
    return store, archive


def _points(store: RunStore) -> tuple[SafePoints, CommandChannel]:
    commands = CommandChannel()
    return (
        SafePoints(commands, store.emit, validate_probe=lambda c: None, run_probe=lambda: None),
        commands,
    )


def _request(archive: PhaseArchive, iteration: int = 2) -> ProposalRequest:
    return ProposalRequest(
        archive=archive, n=1, domain="search", iteration=iteration, cycle=1, default_parent="c000"
    )


def test_safe_points_record_a_steer_note_and_refuse_an_empty_one(tmp_path: Path) -> None:
    store, _ = _run(tmp_path)
    points, commands = _points(store)
    commands.send(Command("steer", by="tui", args={"text": "  show the\npassage titles "}))
    commands.send(Command("steer", by="tui", args={"text": "   "}))
    commands.send(Command("steer", by="tui", args={"text": "x" * 1001}))
    points.poll()
    events = store.events()
    noted = [e for e in events if isinstance(e, SteerNoted)]
    assert [(n.text, n.by) for n in noted] == [("show the passage titles", "tui")]
    warnings = [e.message for e in events if isinstance(e, Log) and e.level == "warning"]
    assert any("needs some words" in w for w in warnings)
    assert any("at most 1,000 characters" in w for w in warnings)
    assert [n.text for n in open_notes(store.root)] == ["show the passage titles"]
    with pytest.raises(ValueError, match="needs some words"):
        check_note("")


def test_llm_session_gets_the_note_in_its_prompt_and_the_archive_keeps_the_outcome(
    tmp_path: Path,
) -> None:
    store, archive = _run(tmp_path)
    points, commands = _points(store)
    commands.send(Command("steer", by="tui", args={"text": "show the passage titles"}))
    points.poll()
    emitted: list[Event] = []

    def emit(ev: Event) -> None:
        emitted.append(ev)
        store.emit(ev)

    script = [
        say(
            tool_call(
                "write_candidate",
                {"code": NEW_CODE, "hypothesis": "titles", "parent": "c000", "surface": "tool_io"},
            )
        )
    ]
    cfg = ProposerConfig(kind="llm", model="m", request_timeout_s=5.0, max_retries=0)
    with ReplayServer(script) as server:
        inner = LLMProposer(ProposerConfig(**{**cfg.__dict__, "base_url": server.base_url}))
        proposer = steered(inner, emit)
        assert proposer.name == "llm" and steered(proposer, emit) is proposer
        session = proposer.propose(_request(archive))
        inner.close()
    system = server.requests[0]["messages"][0]["content"]
    assert "Requests from the human reviewer" in system and "- show the passage titles" in system
    (delivered,) = [e for e in emitted if isinstance(e, SteerDelivered)]
    assert (delivered.applied, delivered.iteration, delivered.proposer) == (True, 2, "llm")
    assert delivered.archive == "harness_phases/cycle-01"
    cid = archive.add_candidate(
        session.candidates[0].code,
        parent_id="c000",
        hypothesis="titles",
        surface="tool_io",
        proposer="llm",
        iteration=2,
    )
    archive.write_json(cid, "scores", {"success_rate": 0.25, "rollouts": 4})
    archive.set_status(cid, "evaluated")
    archive.write_summary()
    (note,) = archive.steer_notes()
    assert note["text"] == "show the passage titles" and note["applied"] is True
    assert note["candidates"] == [{"id": cid, "status": "evaluated", "success_rate": 0.25}]
    on_disk = json.loads(archive.steer_path.read_text(encoding="utf-8"))
    assert on_disk["notes"][note["note_id"]]["candidates"][0]["success_rate"] == 0.25
    # delivered once: the next session gets no note
    assert open_notes(store.root) == []


def test_rules_proposer_records_the_note_as_not_applicable(tmp_path: Path) -> None:
    store, archive = _run(tmp_path)
    points, commands = _points(store)
    commands.send(Command("steer", by="tui", args={"text": "stop after two failed searches"}))
    points.poll()
    proposer = steered(RulesProposer(), store.emit)
    proposer.propose(_request(archive))
    (delivered,) = [e for e in store.events() if isinstance(e, SteerDelivered)]
    assert delivered.applied is False and "not applicable" in delivered.detail
    (note,) = archive.steer_notes()
    assert note["applied"] is False and note["proposer"] == "rules"


def test_a_probe_scratch_archive_takes_no_note(tmp_path: Path) -> None:
    store, _ = _run(tmp_path)
    points, commands = _points(store)
    commands.send(Command("steer", by="tui", args={"text": "show the passage titles"}))
    points.poll()
    scratch = PhaseArchive(store.root / "probes" / "probe-01" / "harness")
    scratch.add_candidate(
        H0, parent_id="", hypothesis="incoming", surface="", proposer=INCOMING, iteration=1
    )
    steered(RulesProposer(), store.emit).propose(_request(scratch))
    assert not any(isinstance(e, SteerDelivered) for e in store.events())
    assert len(open_notes(store.root)) == 1


# ---------------------------------------------------------------------- through a harness phase


def test_a_harness_phase_hands_the_note_to_its_llm_session(tmp_path: Path, tiny_model_dir) -> None:
    from whale_lab.backends import make_backend
    from whale_lab.config import config_from_dict
    from whale_lab.context import RunContext
    from whale_lab.domains import make_domain
    from whale_lab.search.meta_harness import HarnessPhase

    code = H0.replace("Answer the question.", "Answer the question; titles name the entity.")
    script = [
        say(
            tool_call(
                "write_candidate",
                {"code": code, "hypothesis": "titles", "parent": "c000", "surface": "prompts"},
            )
        )
    ]
    with ReplayServer(script) as server:
        cfg = config_from_dict(
            {
                "run": {"directory": str(tmp_path / "runs"), "seed": 0},
                "model": {"path": str(tiny_model_dir)},
                "domain": {
                    "name": "search",
                    "splits": {"weight": 4, "harness": 3, "val": 2, "test": 2},
                },
                "sampling": {"max_new_tokens": 4, "k": 1},
                "harness_search": {
                    "candidates_per_iteration": 1,
                    "smoke_tasks": 1,
                    "acceptance": "best",
                },
                "approval": {"mode": "auto"},
                "proposer": {"kind": "llm", "base_url": server.base_url, "model": "m"},
            }
        )
        store = RunStore(tmp_path / "run")
        points, commands = _points(store)
        commands.send(Command("steer", by="tui", args={"text": "show the passage titles"}))
        points.poll()
        backend = make_backend(cfg)
        try:
            phase = HarnessPhase(
                RunContext.of(cfg, backend, make_domain(cfg), store),
                None,
                proposer=LLMProposer(cfg.proposer, backoff_s=0.01),
            )
            phase.run(REPO / "harnesses" / "search" / "h0.py", iterations=2)
        finally:
            backend.close()
    assert "- show the passage titles" in server.requests[0]["messages"][0]["content"]
    (delivered,) = [e for e in store.events() if isinstance(e, SteerDelivered)]
    assert (delivered.applied, delivered.iteration) == (True, 2)
    (note,) = phase.archive.steer_notes()
    (cand,) = note["candidates"]
    assert cand["id"] == "c001" and cand["success_rate"] is not None  # scored, so its outcome
    store.close()
