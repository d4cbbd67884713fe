"""The header's progress, rates and time left, from the events alone (live and replayed alike)."""

from __future__ import annotations

from whale_lab.events import (
    ActivityProgress,
    CandidateProposed,
    EpisodeFinished,
    EvalResult,
    PhaseEnded,
    PhaseProgress,
    PhaseStarted,
    RunStarted,
    WeightStep,
)
from whale_lab.tui import render
from whale_lab.tui.state import RunView

PLAN = (
    {"cycle": 1, "kind": "weight", "budget": 1.0, "unit": "epochs"},
    {"cycle": 1, "kind": "harness", "budget": 3.0, "unit": "iterations"},
    {"cycle": 2, "kind": "weight", "budget": 1.0, "unit": "epochs"},
)


def started(**kw: object) -> RunView:
    view = RunView()
    view.apply(
        RunStarted(
            run_id="r",
            domain="math",
            model="micro",
            schedule="whale",
            harness="harnesses/h0.py",
            plan=PLAN,
            harness_source="harnesses/math/h0.py",
            ts=100.0,
        )
    )
    return view


def step(n: int, ts: float) -> WeightStep:
    return WeightStep(
        cycle=1,
        step=n,
        epoch=n / 4,
        train_reward=0.5,
        accept_rate=0.5,
        kept=1,
        loss=0.1,
        tokens=10,
        grad_norm=1.0,
        step_seconds=1.0,
        rollouts=4,
        ts=ts,
    )


def label(view: RunView) -> str:
    return render.phase_label(view).plain


def test_the_start_evaluation_shows_its_split_and_count() -> None:
    view = started()
    assert label(view) == "no phase yet"
    view.apply(ActivityProgress(activity="eval", label="val", done=0, total=256, ts=101.0))
    assert label(view) == "start evaluation · val 0/256"
    view.apply(ActivityProgress(activity="eval", label="val", done=96, total=256, seconds=48.0))
    view.activity.live = True
    text = label(view)
    assert "val 96/256" in text and "left 01:20" in text  # 160 episodes at 2 a second
    view.apply(
        EvalResult(
            split="val", cycle=0, phase="start", mean_at_k=0.4, pass_at_k=0.5, k=8, n_tasks=32
        )
    )
    assert "val" not in label(view)


def test_the_weight_phase_counts_steps_not_epochs() -> None:
    view = started()
    view.apply(
        PhaseStarted(
            cycle=1,
            phase="weight",
            budget=1.0,
            budget_unit="epochs",
            steps=4,
            start_step=0,
            ts=110.0,
        )
    )
    view.apply(step(1, 120.0))
    view.apply(PhaseProgress(cycle=1, phase="weight", done=0.25, budget=1.0))
    assert "weight step 1/4" in label(view)
    view.apply(step(2, 130.0))
    view.activity.live = True
    text = label(view)
    assert "step 2/4" in text and "left 00:20" in text  # 2 steps at 10 s
    # the run's ETA waits until a harness iteration has been timed
    assert text.endswith("run —")


def test_harness_iterations_show_the_candidate_scored_and_the_proposer_session() -> None:
    view = started()
    view.apply(PhaseStarted(cycle=1, phase="harness", budget=3.0, budget_unit="iterations"))
    view.apply(ActivityProgress(activity="scoring", label="h0", done=5, total=12))
    assert "harness 0/3 it · scoring h0 5/12" in label(view)
    view.apply(PhaseProgress(cycle=1, phase="harness", done=1.0, budget=3.0))
    assert "harness 1/3 it · proposer session (iteration 2)" in label(view)
    view.apply(
        CandidateProposed(
            cycle=1,
            iteration=2,
            candidate_id="c1-i2-a",
            parent_id="h0",
            hypothesis="h",
            surface="prompt",
            proposer="rules",
        )
    )
    assert "proposer" not in label(view)


def test_a_resumed_harness_phase_goes_on_from_its_iteration() -> None:
    view = started()
    view.apply(PhaseStarted(cycle=1, phase="harness", budget=6.0, budget_unit="iterations"))
    view.apply(PhaseProgress(cycle=1, phase="harness", done=3.0, budget=6.0))
    view.apply(
        RunStarted(
            run_id="r",
            domain="math",
            model="micro",
            schedule="whale",
            harness="harnesses/h0.py",
            resumed=True,
        )
    )
    view.apply(PhaseStarted(cycle=1, phase="harness", budget=6.0, budget_unit="iterations"))
    assert "harness 3/6 it" in label(view)
    # a phase of the next cycle starts from 0
    view.apply(PhaseEnded(cycle=1, phase="harness", reason="budget"))
    view.apply(PhaseStarted(cycle=2, phase="harness", budget=6.0, budget_unit="iterations"))
    assert "harness 0/6 it" in label(view)


def test_the_run_eta_adds_what_is_left_of_the_plan() -> None:
    view = started()
    act = view.activity
    view.apply(
        PhaseStarted(cycle=1, phase="weight", budget=1.0, budget_unit="epochs", steps=4, ts=100.0)
    )
    for n in range(1, 5):
        view.apply(step(n, 100.0 + 10 * n))  # 10 s a step
    view.apply(PhaseEnded(cycle=1, phase="weight", reason="budget", ts=140.0))
    view.apply(ActivityProgress(activity="eval", label="val", done=8, total=8, seconds=20.0))
    view.apply(
        PhaseStarted(cycle=1, phase="harness", budget=3.0, budget_unit="iterations", ts=160.0)
    )
    view.apply(PhaseProgress(cycle=1, phase="harness", done=1.0, budget=3.0, ts=190.0))
    # left: 2 iterations x 30 s, the last weight phase 4 steps x 10 s, 2 evaluation points x 20 s
    left = act.run_left(view.phase, view.phase_done, view.phase_budget, view.phase_active)
    assert left == 2 * 30 + 4 * 10 + 2 * 20


def test_rates_cover_the_last_half_minute_and_only_a_live_run() -> None:
    view = started()
    for i in range(10):
        view.apply(
            EpisodeFinished(
                phase="weight",
                task_id=f"t{i}",
                sample=0,
                turns=1,
                reward=1.0,
                stop_reason="answered",
                tokens=100,
                ts=200.0 + i,
            )
        )
    assert render.rates_text(view, now=210.0) == ""  # a replay: no engine, no rate
    view.activity.live = True
    assert render.rates_text(view, now=210.0) == "1.0 ep/s 100 tok/s"
    assert render.rates_text(view, now=500.0) == ""  # nothing finished lately


def test_the_base_harness_shows_by_the_path_it_came_from() -> None:
    view = started()
    assert render.harness_shown(view) == "harnesses/math/h0.py"
    view.harness = "harness_phases/cycle-01/c1-i2-a/harness.py"
    assert render.harness_shown(view) == "harness_phases/cycle-01/c1-i2-a/harness.py"
