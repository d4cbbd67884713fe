"""The alternation engine end to end: schedules, shared weights, commands, ledger, selection.

Runs use the tiny random model on `ParityDomain` (a real domain the model passes about half the
time), so RSFT really updates the weights and the harness phase really scores under them.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from engine_support import ApproveAll, ParityDomain, RecordingBackend, engine_config

from whale_lab.backends import make_backend
from whale_lab.engine.engine import Engine, EngineError, open_engine
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.report import summarise_run
from whale_lab.engine.schedules import AdaptiveWeightStop, plan
from whale_lab.events import (
    CommandReceived,
    EpisodeFinished,
    EvalResult,
    Event,
    PhaseEnded,
    PhaseStarted,
    ProbeResult,
    RunFinished,
    WeightStep,
)
from whale_lab.seams import Command, CommandChannel
from whale_lab.store import RunStore, atomic_write_json, read_json


def make_engine(
    tmp: Path, cfg: Any = None, *, record: bool = False, commands: Any = None, **sections: Any
) -> tuple[Engine, RunStore, list[Event], Any]:
    cfg = cfg or engine_config(tmp, **sections)
    backend: Any = make_backend(cfg)
    if record:
        backend = RecordingBackend(backend)
    store = RunStore(tmp / "run")
    events: list[Event] = []
    store.subscribe(events.append)
    engine = Engine(
        cfg,
        store,
        reviewer=ApproveAll(),
        commands=commands or CommandChannel(),
        backend=backend,
        domain=ParityDomain(),
    )
    if record:
        backend.engine = engine
    return engine, store, events, backend


def of(events: list[Event], cls: type) -> list[Any]:
    return [e for e in events if isinstance(e, cls)]


def phase_sequence(events: list[Event]) -> list[tuple[int, str]]:
    return [(e.cycle, e.phase) for e in of(events, PhaseStarted)]


def check_eval_pairs(events: list[Event]) -> None:
    """Every evaluation point has a val and a test result under one checkpoint key."""
    evals = of(events, EvalResult)
    val = Counter(e.checkpoint for e in evals if e.split == "val")
    test = Counter(e.checkpoint for e in evals if e.split == "test")
    assert val and val == test


def test_whale_alternates_and_scores_harnesses_under_the_updated_weights(tmp_path: Path) -> None:
    engine, store, events, backend = make_engine(tmp_path, record=True)
    at_weight_end: list[str] = []
    store.subscribe(
        lambda e: (
            at_weight_end.append(backend.digest())
            if isinstance(e, PhaseEnded) and e.phase == "weight"
            else None
        )
    )
    engine.run()
    cfg = engine.cfg
    specs = plan(cfg.schedule)
    assert phase_sequence(events) == [(s.cycle, s.kind) for s in specs]
    ended = of(events, PhaseEnded)
    assert [(e.cycle, e.phase, e.reason) for e in ended] == [
        (s.cycle, s.kind, "budget") for s in specs
    ]
    (finished,) = of(events, RunFinished)
    assert finished.status == "completed"

    # The harness phase generated with the weights the first weight phase left behind.
    start = backend.calls[0][1]
    harness_calls = [d for phase, d in backend.calls if phase == "harness"]
    assert harness_calls and set(harness_calls) == {at_weight_end[0]}
    assert at_weight_end[0] != start  # RSFT did update the weights
    steps = of(events, WeightStep)
    assert any(s.kept for s in steps if s.cycle == 1)

    # Evaluation points: val+test pairs, the start point, one after every phase at least.
    check_eval_pairs(events)
    keys = [e.checkpoint for e in of(events, EvalResult) if e.split == "val"]
    assert keys[0].endswith("checkpoints/start") and len(keys) >= 3

    # The ledger matches what happened.
    ledger = Ledger.read(store.root)
    episodes = Counter(e.phase for e in of(events, EpisodeFinished))
    assert ledger.weight_rollouts == sum(s.rollouts for s in steps) == episodes["weight"] == 32
    assert ledger.eval_rollouts == episodes["eval"]
    archive = read_json(store.root / "harness_phases/cycle-01/state.json")
    assert ledger.harness_rollouts == archive["rollouts"] >= episodes["harness"] > 0
    assert ledger.harness_rollouts == ended[-1].harness_rollouts
    assert [p.kind for p in ledger.phases] == ["weight", "harness", "weight"]
    assert [p.weight_rollouts for p in ledger.phases] == [16, 0, 16]
    state = store.read_state()
    assert state["status"] == "completed" and state["ledger"] == ledger.to_dict()

    # The result: best on val, its test score, best-on-test beside it, as the report reads it.
    summary = summarise_run(store.root)
    best = finished.best
    assert best["val"] == summary.selected_val == max(p.val for p in summary.curve)
    assert best["test"] == summary.selected_test
    assert best["best_on_test"] == summary.best_test
    assert (store.root / best["harness"]).is_file()
    assert best["weights"].startswith("base:") or (store.root / best["weights"]).exists()
    assert read_json(store.root / "result.json")["best"] == best
    store.close()


@pytest.mark.parametrize("kind", ["weight-only", "harness-only", "stagewise", "prompt-only"])
def test_each_schedule_runs_its_phase_sequence(tmp_path: Path, kind: str) -> None:
    engine, store, events, _ = make_engine(
        tmp_path, schedule={"kind": kind, "weight_epochs": 0.25, "total_weight_epochs": 0.25}
    )
    engine.run()
    specs = plan(engine.cfg.schedule)
    assert phase_sequence(events) == [(s.cycle, s.kind) for s in specs]
    assert [e.reason for e in of(events, PhaseEnded)] == ["budget"] * len(specs)
    assert of(events, RunFinished)[-1].status == "completed"
    check_eval_pairs(events)
    ledger = Ledger.read(store.root)
    assert (ledger.weight_rollouts > 0) == any(s.kind == "weight" for s in specs)
    assert (ledger.harness_rollouts > 0) == any(s.kind == "harness" for s in specs)
    if kind == "harness-only":
        assert not (store.root / "weights").exists()  # the frozen model was never trained
    if kind == "prompt-only":
        meta = read_json(store.root / "harness_phases/cycle-01/state.json")
        assert meta["iteration"] == 3  # both iterations ran under the prompt-only rule
    store.close()


def test_adaptive_phases_end_by_their_rules(tmp_path: Path) -> None:
    schedule = {
        "kind": "adaptive",
        "cycles": 1,
        "total_weight_epochs": 3.0,
        "window_epochs": 0.25,
        "patience_epochs": 0.25,
        "min_weight_epochs": 0.25,
        "harness_patience": 1,
        "min_harness_iterations": 2,
        "max_harness_iterations": 4,
    }
    engine, store, events, _ = make_engine(tmp_path, schedule=schedule)
    engine.run()
    cfg = engine.cfg.schedule
    ends = of(events, PhaseEnded)
    assert [e.phase for e in ends] == ["weight", "harness", "weight"]
    total_steps = 12  # 3 epochs of 8 prompts at 2 per step, shared by both weight phases
    left = total_steps
    for cycle, end in ((1, ends[0]), (2, ends[2])):
        rewards = [s.train_reward for s in of(events, WeightStep) if s.cycle == cycle]
        rule = AdaptiveWeightStop(4, cfg)
        fired = [rule.update(r) for r in rewards]
        # the phase ended exactly when the rule first fired, or at what the total budget left
        assert not any(fired[:-1])
        assert end.reason == ("patience" if fired and fired[-1] else "budget")
        assert len(rewards) <= left
        assert end.reason == "patience" or len(rewards) == left
        left -= len(rewards)
    archive = read_json(store.root / "harness_phases/cycle-01/state.json")
    done = len(archive["done"])
    assert 2 <= done <= 4
    assert ends[1].reason == ("budget" if done == 4 else "patience")
    store.close()


def test_a_switch_mid_phase_ends_it_and_records_who_and_why(tmp_path: Path) -> None:
    commands = CommandChannel()
    engine, store, events, _ = make_engine(
        tmp_path, commands=commands, schedule={"weight_epochs": 1.0}
    )

    def on_event(ev: Event) -> None:
        if isinstance(ev, WeightStep) and ev.step == 1:
            commands.send(Command("switch", by="tester", reason="the harness looks weaker"))

    store.subscribe(on_event)
    engine.run()
    ends = of(events, PhaseEnded)
    assert [(e.cycle, e.phase, e.reason) for e in ends] == [
        (1, "weight", "switch"),
        (1, "harness", "budget"),
        (2, "weight", "budget"),
    ]
    first = [s for s in of(events, WeightStep) if s.cycle == 1]
    assert 1 <= len(first) < 4  # the budget was 4 steps
    (cmd,) = [c for c in of(events, CommandReceived) if c.command == "switch"]
    assert (cmd.by, cmd.reason) == ("tester", "the harness looks weaker")
    state = store.read_state()
    (switch,) = state["switches"]
    assert (switch["by"], switch["reason"], switch["phase"], switch["cycle"]) == (
        "tester",
        "the harness looks weaker",
        "weight",
        1,
    )
    # the switched phase still gets its evaluation point (weights at the switch)
    evals = [e for e in of(events, EvalResult) if e.cycle == 1 and e.phase == "weight"]
    assert {e.split for e in evals} == {"val", "test"}
    assert of(events, RunFinished)[-1].status == "completed"
    store.close()


def _wait_for(flag: threading.Event, what: str, engine_thread: threading.Thread) -> None:
    for _ in range(1200):
        if flag.wait(0.1):
            return
        if not engine_thread.is_alive():
            break
    raise AssertionError(f"the engine never reached: {what}")


def test_pause_probe_resume_stop_and_resume_the_run(tmp_path: Path) -> None:
    commands = CommandChannel()
    cfg = engine_config(tmp_path, schedule={"kind": "weight-only", "total_weight_epochs": 1.0})
    engine, store, events, backend = make_engine(tmp_path, cfg, record=True, commands=commands)
    paused, probed, stepped = threading.Event(), threading.Event(), threading.Event()

    def on_event(ev: Event) -> None:
        if isinstance(ev, WeightStep) and ev.step == 1:
            commands.send(Command("pause", by="tester"))
        if isinstance(ev, ProbeResult):
            probed.set()
        if isinstance(ev, WeightStep) and ev.step >= 2:
            stepped.set()
        if isinstance(ev, CommandReceived) and ev.command == "pause":
            paused.set()

    store.subscribe(on_event)
    thread = threading.Thread(target=engine.run)
    thread.start()
    try:
        _wait_for(paused, "pause", thread)
        for _ in range(600):  # the pause takes hold at the next safe point
            if engine.status().state == "paused":
                break
            thread.join(0.05)
        status = engine.status()
        assert status.state == "paused" and status.phase == "weight"
        assert status.commands == {"resume", "switch", "probe", "stop"}
        steps_before = len(of(events, WeightStep))
        rsft = engine.book.rsft
        sampler, digest = rsft.sampler.state_dict(), backend.digest()
        harness = engine.harness_path.read_text(encoding="utf-8")
        commands.send(
            Command("probe", by="tester", args={"harness_iterations": 2, "weight_steps": 1})
        )
        _wait_for(probed, "probe result", thread)
        # the probe left the run as it was, and the run stayed paused
        assert rsft.sampler.state_dict() == sampler and backend.digest() == digest
        assert engine.harness_path.read_text(encoding="utf-8") == harness
        assert len(of(events, WeightStep)) == steps_before
        commands.send(Command("resume", by="tester"))
        _wait_for(stepped, "a step after resuming", thread)
        commands.send(Command("stop", by="tester", reason="done for today"))
        thread.join(120)
    finally:
        commands.send(Command("stop", by="tester"))
        thread.join(120)
    assert not thread.is_alive()
    finished = of(events, RunFinished)[-1]
    assert finished.status == "stopped" and "whale-lab resume" in finished.message
    (probe,) = of(events, ProbeResult)
    assert probe.recommendation and probe.evidence
    store.close()

    # resumed from the folder, it finishes the budget; no step is repeated or lost
    engine2, store2 = open_engine(
        cfg,
        str(tmp_path / "run"),
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=backend.inner,
        domain=ParityDomain(),
    )
    engine2.run()
    store2.close()
    all_events = RunStore.read_events(tmp_path / "run")
    steps = [e.step for e in of(all_events, WeightStep)]
    assert steps == [1, 2, 3, 4]
    assert of(all_events, RunFinished)[-1].status == "completed"
    ledger = Ledger.read(tmp_path / "run")
    assert ledger.weight_rollouts == 4 * 8 and ledger.probe_rollouts > 0
    assert ledger.probes[0].kept == ()
    assert ledger.probe_rollouts == ledger.probes[0].rollouts


def test_selection_is_by_val_and_test_is_only_reported(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path)
    store = RunStore(tmp_path / "run")
    engine = Engine(
        cfg, store, reviewer=ApproveAll(), commands=CommandChannel(), domain=ParityDomain()
    )
    for key, val, test, rollouts in (
        ("checkpoints/a", 0.50, 0.90, 10),
        ("checkpoints/b", 0.80, 0.30, 20),
        ("checkpoints/c", 0.80, 0.10, 30),
    ):
        folder = store.root / key
        folder.mkdir(parents=True)
        engine.state.checkpoints[key] = {
            "harness": f"{key}/harness.py",
            "weights": f"{key}/weights",
        }
        for split, score in (("val", val), ("test", test)):
            store.emit(
                EvalResult(
                    split=split,
                    cycle=1,
                    phase="harness",
                    mean_at_k=score,
                    pass_at_k=score,
                    k=2,
                    n_tasks=2,
                    checkpoint=str(folder),
                    weight_rollouts=rollouts,
                )
            )
    best = engine.best()
    # best on val (ties to fewer rollouts), with its own test score; best-on-test only beside it
    assert (best["checkpoint"], best["val"], best["test"]) == ("checkpoints/b", 0.80, 0.30)
    assert (best["harness"], best["weights"]) == (
        "checkpoints/b/harness.py",
        "checkpoints/b/weights",
    )
    assert (best["best_on_test"], best["best_on_test_checkpoint"]) == (0.90, "checkpoints/a")
    assert "paper" in best["best_on_test_note"]
    store.close()


def test_run_folders_that_cannot_be_opened_say_why(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path)
    kw: dict[str, Any] = {"reviewer": ApproveAll(), "commands": CommandChannel()}
    with pytest.raises(EngineError, match="not found"):
        open_engine(cfg, tmp_path / "missing", **kw)
    (tmp_path / "empty").mkdir()
    with pytest.raises(EngineError, match="no readable config.json"):
        open_engine(cfg, tmp_path / "empty", **kw)
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "search.json").write_text("{}")
    with pytest.raises(EngineError, match="whale-lab search --resume"):
        open_engine(cfg, tmp_path / "search", **kw)
    engine, store = open_engine(cfg, None, **kw, domain=ParityDomain())
    atomic_write_json(store.root / "engine.lock", {"pid": os.getppid()})
    with pytest.raises(EngineError, match="already open in process"):
        engine.run()
    store.close()
    bad = engine_config(tmp_path, approval={"mode": "manual"})
    with pytest.raises(EngineError, match="reviewer"):
        Engine(bad, RunStore(tmp_path / "r2"), reviewer=None, commands=CommandChannel())  # type: ignore[arg-type]
