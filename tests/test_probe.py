"""Bottleneck probes: diagnostics -> recommendation on traces built to show each failure, and a
real probe that leaves the run's weights and harness alone unless asked to keep a result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from engine_support import ApproveAll, ParityDomain, engine_config

from whale_lab.backends import make_backend
from whale_lab.engine.engine import Engine
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.probe import (
    ProbeSettings,
    Signal,
    probe_diagnostics,
    read_signals,
    recommend,
)
from whale_lab.events import CommandReceived, EpisodeFinished, ProbeResult
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json
from whale_lab.trace import EpisodeTrace, TurnRecord
from whale_lab.weights.checkpoint import Checkpointer


def turn(kind: str = "answer", finish: str = "stop") -> TurnRecord:
    return TurnRecord(
        prompt=[{"role": "user", "content": "q"}],
        response="r",
        finish_reason=finish,
        prompt_tokens=20,
        completion_tokens=5,
        action={"kind": kind, "value": "v"},
    )


def ep(
    task: int,
    sample: int = 0,
    *,
    reward: float = 0.0,
    stop: str = "answered",
    turns: int = 1,
    kind: str = "answer",
    **extra: Any,
) -> EpisodeTrace:
    info = extra.pop("info", {})
    return EpisodeTrace(
        task_id=f"t{task}",
        domain="x",
        sample=sample,
        harness="h0",
        turns=[turn(kind) for _ in range(turns)],
        reward=reward,
        stop_reason=stop,
        info=info,
        **extra,
    )


def grid(tasks: int, k: int, make: Any) -> list[EpisodeTrace]:
    return [make(t, s) for t in range(tasks) for s in range(k)]


# Each case: traces that show one failure kind, the signal it must raise, the side it points at.
CASES: dict[str, tuple[str, Any, str, str]] = {
    "format failures": (
        "math",
        lambda: grid(
            4,
            2,
            lambda t, s: ep(
                t, s, stop="format_failure", turns=2, kind="invalid", format_failures=2
            ),
        ),
        "format_failure_rate",
        "harness",
    ),
    "tool errors": (
        "math",
        lambda: grid(
            4,
            2,
            lambda t, s: ep(
                t, s, reward=float(t < 2), turns=3, kind="tool", tool_calls=2, tool_errors=1
            ),
        ),
        "tool_error_rate",
        "harness",
    ),
    "turn cap": (
        "math",
        lambda: grid(
            4,
            2,
            lambda t, s: ep(
                t, s, reward=float(t == 0), stop="turn_cap" if t else "answered", turns=2
            ),
        ),
        "stop_turn_cap",
        "harness",
    ),
    "token cap": (
        "math",
        lambda: grid(4, 2, lambda t, s: ep(t, s, reward=float(t < 3), turns=2, token_cap_hits=1)),
        "token_cap",
        "harness",
    ),
    "solved sometimes": (
        "math",
        lambda: grid(4, 4, lambda t, s: ep(t, s, reward=float(s == t % 4))),
        "pass_mean_gap",
        "weights",
    ),
    "retrieval misses": (
        "search",
        lambda: grid(
            4,
            2,
            lambda t, s: ep(
                t,
                s,
                reward=float(t < 3),
                turns=2,
                kind="tool",
                tool_calls=1,
                info={"retrieval_recall": t == 0},
            ),
        ),
        "retrieval_recall",
        "harness",
    ),
    "illegal moves": (
        "chess",
        lambda: grid(
            4,
            2,
            lambda t, s: ep(
                t,
                s,
                reward=float(t == 0),
                stop="illegal_moves" if t else "solved",
                turns=3,
                kind="move",
                illegal_moves=2 if t else 0,
            ),
        ),
        "legal_move_rate",
        "harness",
    ),
    "wrong answers": (
        "math",
        lambda: grid(5, 2, lambda t, s: ep(t, s, reward=float(t == 0))),
        "accuracy_when_answered",
        "weights",
    ),
    "nothing solved": (
        "math",
        lambda: grid(4, 2, lambda t, s: ep(t, s, reward=0.0, turns=1)),
        "pass_at_k",
        "harness",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_failure_kind_points_at_its_side(case: str) -> None:
    domain, make, key, side = CASES[case]
    traces = make()
    k = max(t.sample for t in traces) + 1
    diag = probe_diagnostics(traces, domain=domain, k=k)
    signals = read_signals(diag, domain)
    assert key in {s.key for s in signals}, (case, diag)
    (signal,) = [s for s in signals if s.key == key]
    assert signal.side == side
    assert {s.side for s in signals} == {side}  # each trace set shows one kind of failure
    # with no measured gain either way, the traces decide
    rec = recommend(0.0, 0.0, signals)
    assert rec.side == side
    assert signal.text in rec.evidence
    word = "harness" if side == "harness" else "weights"
    assert rec.text.startswith(f"The {word} ")


def test_healthy_traces_raise_no_signal() -> None:
    traces = grid(4, 2, lambda t, s: ep(t, s, reward=1.0))
    diag = probe_diagnostics(traces, domain="math", k=2)
    assert diag["mean_at_k"] == diag["pass_at_k"] == 1.0
    assert read_signals(diag, "math") == []
    rec = recommend(0.0, 0.0, [])
    assert rec.side == "unclear" and rec.text.startswith("No clear bottleneck")


def test_measured_gains_decide_and_ties_go_to_the_traces() -> None:
    harness_signs = read_signals(
        probe_diagnostics(
            grid(4, 2, lambda t, s: ep(t, s, stop="turn_cap", turns=2)), domain="math", k=2
        ),
        "math",
    )
    assert recommend(0.050, 0.010, []).side == "harness"
    # a clear weight gain beats trace signals that point at the harness
    rec = recommend(0.001, 0.040, harness_signs)
    assert rec.side == "weights" and "+0.040" in rec.text
    # within 20% of each other: a tie, decided by the traces
    assert recommend(0.0100, 0.0110, harness_signs).side == "harness"
    # neither improved: the traces decide
    assert recommend(-0.01, -0.02, harness_signs).side == "harness"
    # a side that could not run is not a measurement
    rec = recommend(None, 0.02, [], harness_note="harness probe could not run: bad harness")
    assert rec.side == "weights" and "not measured" in rec.evidence[0]
    assert "could not run" in rec.evidence[0]


def test_probe_settings_from_command_args() -> None:
    base = ProbeSettings(harness_iterations=3, weight_steps=3)
    s = ProbeSettings.from_args({"keep": True, "weight_steps": 1}, base)
    assert (s.keep, s.weight_steps, s.harness_iterations) == ("best", 1, 3)
    with pytest.raises(ValueError, match="keep"):
        ProbeSettings.from_args({"keep": "everything"})
    with pytest.raises(ValueError, match="weight_steps"):
        ProbeSettings.from_args({"weight_steps": 0})


def lora(backend: Any) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters() if "lora_" in n}


def test_a_probe_measures_both_sides_and_keeps_only_when_asked(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path, schedule={"kind": "weight-only"})
    backend = make_backend(cfg)
    store = RunStore(tmp_path / "run")
    events: list[Any] = []
    store.subscribe(events.append)
    engine = Engine(
        cfg,
        store,
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=backend,
        domain=ParityDomain(),
    )
    harness = engine.harness_path.read_text(encoding="utf-8")

    result = engine.probe_now(ProbeSettings(harness_iterations=2, weight_steps=1))
    assert isinstance(result, ProbeResult)
    assert [e.command for e in events if isinstance(e, CommandReceived)] == ["probe"]
    # both sides measured, with their rollouts; the recommendation cites its evidence
    d = result.diagnostics
    assert d["harness_probe_rollouts"] > 0 and d["weight_probe_rollouts"] == 8
    assert "val_mean_at_k_after_weight_probe" in d and "episodes" in d
    assert result.recommendation and len(result.evidence) >= 2
    # nothing kept: LoRA back to its initial state (B = 0: the base model), harness unchanged
    after = lora(backend)
    assert after and all(float(t.abs().sum()) == 0.0 for n, t in after.items() if "lora_B" in n)
    assert engine.harness_path.read_text(encoding="utf-8") == harness
    assert Checkpointer(store.root / "weights").latest() is None
    report = read_json(store.root / "probes/probe-001/probe.json")
    assert report["kept"] == [] and report["weight_probe"]["ran"]
    probe_eps = [e for e in events if isinstance(e, EpisodeFinished)]
    assert probe_eps and {e.phase for e in probe_eps} == {"probe"}
    assert all((store.root / e.trace_path).is_file() for e in probe_eps)
    ledger = Ledger.read(store.root)
    assert ledger.probe_rollouts == ledger.probes[0].rollouts > 0
    assert ledger.weight_rollouts == 0 and ledger.kept_probe_rollouts == 0

    # asked to keep the weights: the run's weights are the probe's, persisted for resume
    result = engine.probe_now(ProbeSettings(harness_iterations=2, weight_steps=1, keep="weights"))
    assert result is not None
    kept = lora(backend)
    assert any(float(t.abs().sum()) > 0 for n, t in kept.items() if "lora_B" in n)
    latest = Checkpointer(store.root / "weights").latest()
    assert latest is not None
    from safetensors.torch import load_file

    saved = load_file(str(Path(latest["path"]) / "trainable.safetensors"))
    live = {n: p for n, p in engine.book.rsft.tm.named_trainable()}
    assert set(saved) == set(live)
    assert all(torch.equal(saved[n], live[n].detach().cpu()) for n in saved)
    state = store.read_state()
    assert state["kept_weights"] == 1 and state["probes"][1]["kept"] == ["weights"]
    ledger = Ledger.read(store.root)
    assert ledger.weight_rollouts == 8 == ledger.kept_probe_rollouts
    assert engine.harness_path.read_text(encoding="utf-8") == harness
    store.close()


def test_paired_intervals_name_a_side_only_when_they_exclude_zero() -> None:
    turn_cap = [Signal("harness", "turn_cap", 0.4, "turn cap: 40% of episodes ran out of turns")]
    rec = recommend(0.9, 0.1, turn_cap, harness_interval=(-0.2, 2.0), weight_interval=(-0.1, 0.3),
                    needed="About 90 val tasks would resolve it.")
    assert rec.side == "inconclusive"
    assert "no difference detected at this size" in rec.text and "About 90 val tasks" in rec.text
    assert "do not confirm" in rec.text  # the traces are evidence, never the verdict
    rec = recommend(0.9, 0.1, [], harness_interval=(0.2, 1.6), weight_interval=(-0.1, 0.3))
    assert rec.side == "harness" and "excludes zero" in rec.text
    rec = recommend(0.1, 0.9, [], harness_interval=(-0.2, 0.3), weight_interval=(0.1, 1.7))
    assert rec.side == "weights"
    rec = recommend(0.5, 0.6, [], harness_interval=(0.1, 0.9), weight_interval=(0.2, 1.0))
    assert rec.side == "both"
    assert any("paired" in e for e in rec.evidence)


def test_a_probe_reports_each_side_with_interval_and_verdict(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path, schedule={"kind": "weight-only"})
    engine = Engine(
        cfg,
        RunStore(tmp_path / "run"),
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=make_backend(cfg),
        domain=ParityDomain(),
    )
    result = engine.probe_now(ProbeSettings(harness_iterations=2, weight_steps=1))
    assert isinstance(result, ProbeResult)
    assert result.verdict in ("harness", "weights", "both", "inconclusive")
    for side in ("harness", "weights"):
        s = result.sides[side]
        assert set(s) >= {"gain_per_1k", "interval", "verdict"}
        assert s["verdict"] in ("gain", "loss", "inconclusive", "unchanged", "not run")
        if s["interval"] is not None:
            low, high = s["interval"]
            assert low <= high
            if result.verdict in (side, "both"):
                assert low > 0  # a named side's interval excludes zero
