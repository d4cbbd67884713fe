"""Bottleneck probes: diagnostics -> recommendation on traces built to show each failure, and a
real probe that leaves the run's weights and harness alone unless asked to keep a result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from engine_support import ApproveAll, ParityDomain, engine_config

from whale_lab.backends import make_backend
from whale_lab.engine.engine import Engine
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.probe import (
    BottleneckProbe,
    ProbeSettings,
    SideResult,
    Signal,
    _needed_text,
    judge_side,
    keep_best,
    probe_diagnostics,
    read_signals,
    recommend,
)
from whale_lab.events import CommandReceived, EpisodeFinished, ProbeResult
from whale_lab.paired import MIN_TASKS, paired_difference, scores_by_task
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
    n = {"harness_backing": 8, "weight_backing": 8}
    rec = recommend(0.9, 0.1, turn_cap, harness_interval=(-0.2, 2.0), weight_interval=(-0.1, 0.3),
                    needed="About 90 val tasks would resolve it.", **n)
    assert rec.side == "inconclusive"
    assert "no difference detected at this size" in rec.text and "About 90 val tasks" in rec.text
    assert "do not confirm" in rec.text  # the traces are evidence, never the verdict
    rec = recommend(0.9, 0.1, [], harness_interval=(0.2, 1.6), weight_interval=(-0.1, 0.3), **n)
    assert rec.side == "harness" and "excludes zero with 8 val tasks up" in rec.text
    rec = recommend(0.1, 0.9, [], harness_interval=(-0.2, 0.3), weight_interval=(0.1, 1.7), **n)
    assert rec.side == "weights"
    rec = recommend(0.5, 0.6, [], harness_interval=(0.1, 0.9), weight_interval=(0.2, 1.0), **n)
    assert rec.side == "both"
    assert any("paired" in e for e in rec.evidence)


def test_a_side_needs_at_least_five_tasks_behind_its_interval() -> None:
    """A bootstrap over a handful of changed tasks is narrow by construction: an interval above
    zero names a side only when at least MIN_TASKS val tasks rose."""
    assert MIN_TASKS == 5
    interval = (0.2, 1.6)
    rec = recommend(0.9, 0.0, [], harness_interval=interval, weight_interval=(0.0, 0.0),
                    harness_backing=4, weight_backing=0)
    assert rec.side == "inconclusive"
    assert "harness interval is above zero but only 4 val tasks back it" in rec.text
    rec = recommend(0.9, 0.0, [], harness_interval=interval, weight_interval=(0.0, 0.0),
                    harness_backing=5, weight_backing=0)
    assert rec.side == "harness"
    # a count that is not known backs nothing
    rec = recommend(0.9, 0.0, [], harness_interval=interval, weight_interval=(0.0, 0.0))
    assert rec.side == "inconclusive"


def _val(rewards: dict[int, list[float]]) -> list[EpisodeTrace]:
    return [ep(t, s, reward=r) for t, rs in rewards.items() for s, r in enumerate(rs)]


def test_an_inconclusive_side_says_the_tasks_and_rollouts_it_would_need() -> None:
    k = 4
    before = _val({t: [1.0, 0.0, 0.0, 0.0] for t in range(8)})
    # one more correct rollout on two tasks, one fewer on one: a small, noisy change
    after = _val(
        {t: ([1.0, 1.0, 0.0, 0.0] if t in (0, 1) else [0.0] * 4 if t == 2 else [1.0, 0.0, 0.0, 0.0])
         for t in range(8)}
    )
    side = SideResult("weights", ran=True, rollouts=96)
    judge_side(side, before, after, k=k)
    paired = paired_difference(scores_by_task(before), scores_by_task(after))
    assert side.verdict == "inconclusive" and side.n_tasks == 8
    assert side.interval == pytest.approx((paired.low * 1000 / 96, paired.high * 1000 / 96))
    assert side.needed_tasks == max(paired.needed_tasks() or 0, MIN_TASKS) > 8
    assert side.needed_rollouts == side.needed_tasks * k
    text = _needed_text([side], n_tasks=8, k=k)
    assert f"{side.needed_tasks:,} paired val tasks x k = 4" in text
    assert f"{side.needed_rollouts:,} val rollouts per arm" in text
    # a clear gain on enough tasks: named, nothing more needed
    gain = SideResult("harness", ran=True, rollouts=50)
    judge_side(gain, before, _val({t: [1.0, 1.0, 1.0, 0.0] for t in range(8)}), k=k)
    assert gain.verdict == "gain" and gain.supported and gain.needed_tasks is None
    # the same gain on 3 tasks: no verdict, and at least the minimum is needed
    few = SideResult("harness", ran=True, rollouts=50)
    judge_side(few, before[:12], _val({t: [1.0, 1.0, 1.0, 0.0] for t in range(3)}), k=k)
    assert few.interval is not None and few.interval[0] > 0  # identical differences: narrow
    assert few.verdict == "inconclusive" and not few.supported
    assert few.needed_tasks == MIN_TASKS and few.needed_rollouts == MIN_TASKS * k


def test_four_tasks_up_among_twenty_ties_name_no_side() -> None:
    """The README's math probe at k = 4 on 24 val tasks: the weight probe added one correct
    rollout on each of 4 tasks, none fell, 20 tied. The percentile bootstrap's low end is above
    zero (a resample with none of the 4 is rarer than 2.5%), but a sign test on 4 tasks gives
    p = 0.125: not named, and the size that would resolve it is said in tasks and rollouts."""
    k = 4
    before = _val({t: [1.0, 0.0, 0.0, 0.0] for t in range(24)})
    after = _val({t: [1.0, 1.0, 0.0, 0.0] if t < 4 else [1.0, 0.0, 0.0, 0.0] for t in range(24)})
    side = SideResult("weights", ran=True, rollouts=192)
    judge_side(side, before, after, k=k)
    assert (side.n_tasks, side.wins, side.losses) == (24, 4, 0)
    assert side.interval is not None and side.interval[0] > 0
    assert side.verdict == "inconclusive" and not side.supported
    # the observed spread says 41 tasks; 4 of 24 moving needs at least 30 for 5 to move
    assert side.needed_tasks == 41 and side.needed_rollouts == 164
    rec = recommend(0.0, side.gain_per_1k, [], harness_interval=(0.0, 0.0),
                    weight_interval=side.interval, harness_backing=0, weight_backing=side.wins)
    assert rec.side == "inconclusive"
    assert "weights interval is above zero but only 4 val tasks back it" in rec.text
    side, note = keep_best(SideResult("harness", ran=True, gain_per_1k=0.0, interval=(0.0, 0.0),
                                      verdict="unchanged"), side)
    assert side is None and "kept the incumbent" in note


def _side(name: str, gain: float, interval: tuple[float, float], wins: int = 8) -> SideResult:
    return SideResult(name, ran=True, gain_per_1k=gain, interval=interval, n_tasks=12, wins=wins,
                      verdict="gain" if interval[0] > 0 and wins >= MIN_TASKS else "inconclusive")


def test_keep_best_follows_the_intervals_not_the_point_estimates() -> None:
    keep = BottleneckProbe._keep_side
    # the harness's point estimate is larger, but only the weights' interval excludes zero
    harness, weights = _side("harness", 5.0, (-1.0, 11.0)), _side("weights", 1.0, (0.2, 1.8))
    side, note = keep_best(harness, weights)
    assert side == "weights" and "kept the weights" in note and "the other's does not" in note
    assert keep("weights", "best", harness, weights) and not keep("harness", "best", harness, weights)
    # neither excludes zero: the incumbent stays, and the note says so
    weights = _side("weights", 1.0, (-0.2, 1.8))
    side, note = keep_best(harness, weights)
    assert side is None and "kept the incumbent" in note
    assert not keep("weights", "best", harness, weights)
    assert not keep("harness", "best", harness, weights)
    # above zero on too few tasks: not kept
    side, _ = keep_best(_side("harness", 5.0, (1.0, 9.0), wins=4), weights)
    assert side is None
    # both exclude zero: the higher low end (the surer gain per rollout)
    side, note = keep_best(_side("harness", 5.0, (0.1, 9.9)), _side("weights", 1.0, (0.5, 1.5)))
    assert side == "weights" and "both exclude zero" in note
    # asked by name: kept regardless of the interval
    assert keep("harness", "harness", harness, weights) and keep("harness", "both", harness, weights)
    assert not keep("harness", "none", harness, weights)


# The embedded micro model on math at tiny sizes: about 10 s on one core.
CLI_TINY = (
    "domain.splits.weight=8",
    "domain.splits.harness=4",
    "domain.splits.val=6",
    "domain.splits.test=2",
    "sampling.k=2",
    "rsft.prompts_per_step=2",
    "rsft.samples_per_prompt=4",
    "harness_search.candidates_per_iteration=1",
    "harness_search.smoke_tasks=1",
)


@pytest.mark.timeout(120)
def test_probe_json_command_gives_each_side_its_gain_interval_and_verdict(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from whale_lab.cli import main

    argv = ["--set", f"run.directory={json.dumps(str(tmp_path / 'runs'))}"]
    for item in CLI_TINY:
        argv += ["--set", item]
    rc = main([*argv, "probe", "--domain", "math", "--keep", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err[-2000:]
    data = json.loads(out)
    assert data["verdict"] in ("harness", "weights", "both", "inconclusive")
    k = 2
    for name in ("harness", "weights"):
        side = data[name]
        assert set(side) >= {"gain_per_1k", "interval", "verdict", "n_tasks", "wins"}
        assert isinstance(side["gain_per_1k"], float)
        low, high = side["interval"]
        assert low <= high
        assert side["verdict"] in ("gain", "loss", "inconclusive", "unchanged")
        named = data["verdict"] in (name, "both")
        # a named side: its interval's low end is above zero and at least 5 val tasks rose
        assert named == (low > 0 and side["wins"] >= MIN_TASKS)
        if side["verdict"] == "inconclusive" and side["needed_tasks"] is not None:
            # the size that would resolve it, in tasks and in tasks x k rollouts
            assert side["needed_tasks"] >= MIN_TASKS
            assert side["needed_rollouts"] == side["needed_tasks"] * k
            assert "paired val tasks x k = 2" in data["recommendation"]
    assert data["keep_note"].startswith("keep best: kept the")
    probe = json.loads((Path(data["run_dir"]) / "probes/probe-001/probe.json").read_text())
    assert probe["keep_note"] == data["keep_note"]
    if data["verdict"] == "inconclusive":
        assert "kept the incumbent" in data["keep_note"] and probe["kept"] == []


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
