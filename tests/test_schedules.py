"""Each schedule's phase sequence and the adaptive stopping rules at their edges."""

from __future__ import annotations

import pytest

from whale_lab.config import ScheduleConfig
from whale_lab.engine.schedules import (
    AdaptiveHarnessStop,
    AdaptiveWeightStop,
    adaptive_weight_steps,
    plan,
    proposal_budget,
)


def _kinds(cfg: ScheduleConfig) -> list[tuple[str, int, float]]:
    return [(p.kind, p.cycle, p.budget) for p in plan(cfg)]


def test_whale_alternates_and_ends_after_a_weight_phase() -> None:
    cfg = ScheduleConfig(kind="whale", cycles=2, weight_epochs=0.6, first_weight_epochs=0.0,
                         harness_iterations=6)
    assert _kinds(cfg) == [("weight", 1, 0.6), ("harness", 1, 6.0), ("weight", 2, 0.6),
                           ("harness", 2, 6.0), ("weight", 3, 0.6)]
    assert not any(p.prompt_only for p in plan(cfg))


def test_a_shorter_first_weight_phase_changes_only_the_first() -> None:
    """The app's default reaches its first harness review sooner; later phases keep E, and 0
    (the paper's schedule, and the comparison's) means every phase gets weight_epochs."""
    cfg = ScheduleConfig(kind="whale", cycles=2, weight_epochs=0.6, first_weight_epochs=0.1)
    assert _kinds(cfg) == [("weight", 1, 0.1), ("harness", 1, 6.0), ("weight", 2, 0.6),
                           ("harness", 2, 6.0), ("weight", 3, 0.6)]
    same = ScheduleConfig(kind="whale", cycles=2, weight_epochs=0.6, first_weight_epochs=0.0)
    assert [p.budget for p in plan(same) if p.kind == "weight"] == [0.6, 0.6, 0.6]


def test_the_shipped_whale_toml_starts_with_a_short_first_weight_phase() -> None:
    from pathlib import Path

    from whale_lab.config import load_config

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(str(root / "whale.toml"), []).schedule
    assert plan(cfg)[0].budget == cfg.first_weight_epochs == 0.1
    assert plan(cfg)[2].budget == cfg.weight_epochs


def test_prompt_only_is_whale_with_prompt_only_harness_phases() -> None:
    phases = plan(ScheduleConfig(kind="prompt-only", cycles=1))
    assert [p.kind for p in phases] == ["weight", "harness", "weight"]
    assert [p.prompt_only for p in phases] == [False, True, False]


def test_single_component_and_stagewise() -> None:
    assert _kinds(ScheduleConfig(kind="weight-only", total_weight_epochs=1.5)) == [("weight", 1, 1.5)]
    assert _kinds(ScheduleConfig(kind="harness-only", total_harness_iterations=9)) == [("harness", 1, 9.0)]
    assert _kinds(ScheduleConfig(kind="stagewise", total_weight_epochs=1.0, total_harness_iterations=4)) == [
        ("weight", 1, 1.0), ("harness", 1, 4.0)]


def test_adaptive_phases_are_capped_and_flagged() -> None:
    phases = plan(ScheduleConfig(kind="adaptive", cycles=1, total_weight_epochs=1.0,
                                 max_harness_iterations=15))
    assert [p.kind for p in phases] == ["weight", "harness", "weight"]
    assert all(p.adaptive for p in phases)
    # no per-phase cap by default: a weight phase may use what the total budget has left
    assert phases[0].budget == pytest.approx(1.0) and phases[1].budget == 15
    capped = plan(ScheduleConfig(kind="adaptive", cycles=1, total_weight_epochs=1.0,
                                 max_phase_weight_epochs=0.3))
    assert [p.budget for p in capped if p.kind == "weight"] == [pytest.approx(0.3)] * 2


def test_adaptive_weight_rule_waits_for_window_and_patience() -> None:
    cfg = ScheduleConfig(window_epochs=0.2, patience_epochs=0.2, min_weight_epochs=0.2)
    rule = AdaptiveWeightStop(steps_per_epoch=10, cfg=cfg)  # window 2, patience 2, min 2
    assert (rule.window, rule.patience, rule.min_steps) == (2, 2, 2)
    assert rule.update(0.1) is False  # tracked from the first step: best 0.1, below the minimum
    assert rule.update(0.3) is False  # window full: new best 0.2
    assert rule.update(0.5) is False  # 0.4: new best
    assert rule.update(0.3) is False  # 0.4: ties do not count as a new best -> since_best 1
    assert rule.update(0.1) is True   # 0.2: since_best 2 == patience


def test_adaptive_weight_rule_respects_minimum_length() -> None:
    cfg = ScheduleConfig(window_epochs=0.1, patience_epochs=0.1, min_weight_epochs=0.5)
    rule = AdaptiveWeightStop(steps_per_epoch=10, cfg=cfg)  # window 1, patience 1, min 5
    fired = [rule.update(r) for r in (0.5, 0.4, 0.3, 0.2, 0.1)]
    assert fired == [False, False, False, False, True]


def test_adaptive_weight_rule_resumes_from_state() -> None:
    cfg = ScheduleConfig(window_epochs=0.2, patience_epochs=0.2, min_weight_epochs=0.2)
    a = AdaptiveWeightStop(10, cfg)
    for r in (0.1, 0.3, 0.5):
        a.update(r)
    b = AdaptiveWeightStop(10, cfg)
    b.load_state_dict(a.state_dict())
    assert [b.update(0.3), b.update(0.1)] == [a.update(0.3), a.update(0.1)] == [False, True]


def test_adaptive_harness_rule_minimum_patience_and_cap() -> None:
    cfg = ScheduleConfig(harness_patience=2, min_harness_iterations=3, max_harness_iterations=5)
    rule = AdaptiveHarnessStop(cfg)
    # no improvement after the first, but the minimum holds it to 3 iterations
    assert [rule.update(s) for s in (0.5, 0.5, 0.5)] == [False, False, True]
    rule = AdaptiveHarnessStop(cfg)
    # steady improvement runs into the cap
    assert [rule.update(s) for s in (0.1, 0.2, 0.3, 0.4, 0.5)] == [False] * 4 + [True]
    rule = AdaptiveHarnessStop(cfg)
    assert [rule.update(s) for s in (0.1, 0.2, 0.3, 0.3, 0.3)] == [False, False, False, False, True]


def test_the_shipped_comparison_budget_is_the_same_for_every_schedule() -> None:
    """docs/results/compare.toml backs the README's comparison: equal weight budgets and equal
    harness budgets in proposals (iterations differ: each harness phase's first re-scores)."""
    import dataclasses
    from pathlib import Path

    from whale_lab.config import load_config

    path = Path(__file__).resolve().parents[1] / "docs" / "results" / "compare.toml"
    cfg = load_config(str(path), []).schedule
    budgets = {}
    for kind in ("whale", "adaptive", "weight-only", "harness-only", "stagewise", "prompt-only"):
        phases = plan(dataclasses.replace(cfg, kind=kind))
        budgets[kind] = (
            round(sum(p.budget for p in phases if p.kind == "weight"), 6),
            sum(p.budget for p in phases if p.kind == "harness"),
        )
    weight = {budgets[k][0] for k in ("whale", "weight-only", "stagewise", "prompt-only")}
    assert weight == {0.75} and budgets["harness-only"] == (0, 3.0)
    # adaptive weight phases share the total (the engine gives each what the earlier ones left)
    assert cfg.total_weight_epochs == 0.75
    adaptive = plan(dataclasses.replace(cfg, kind="adaptive"))
    assert all(p.budget <= cfg.total_weight_epochs for p in adaptive if p.kind == "weight")
    assert budgets["whale"][1] == budgets["prompt-only"][1] == budgets["adaptive"][1] == 4.0
    assert budgets["stagewise"][1] == 3.0
    assert cfg.min_harness_iterations == cfg.max_harness_iterations  # adaptive: no shorter phase
    m = load_config(str(path), []).harness_search.candidates_per_iteration
    assert {proposal_budget(dataclasses.replace(cfg, kind=k), m) for k in budgets} - {0} == {6}


def test_a_plateau_ends_the_adaptive_weight_phase_at_its_minimum() -> None:
    # the paper's setting: window = minimum length = patience = 0.2 epoch (10 steps per epoch)
    cfg = ScheduleConfig(window_epochs=0.2, patience_epochs=0.2, min_weight_epochs=0.2)
    rule = AdaptiveWeightStop(steps_per_epoch=10, cfg=cfg)
    rewards = [0.5] * 20  # flat from the first step: nothing left to learn here
    fired = [rule.update(r) for r in rewards]
    first = fired.index(True) + 1
    assert first / 10 <= 0.2 + 0.1 + 1e-9  # ends at the minimum (plus the patience's last step)
    # before the fix the rule waited for a full window, then patience: never before 0.4 epoch


def test_a_reward_that_plateaus_at_a_fifth_of_an_epoch_ends_the_phase_there() -> None:
    cfg = ScheduleConfig(window_epochs=0.05, patience_epochs=0.05, min_weight_epochs=0.1)
    rule = AdaptiveWeightStop(steps_per_epoch=20, cfg=cfg)  # window 1, patience 1, min 2
    rising = [0.1 * (i + 1) for i in range(4)]  # 4 steps = 0.2 epoch of progress
    fired = [rule.update(r) for r in rising + [0.4] * 10]
    first = fired.index(True) + 1
    assert first == 5  # the first step after the plateau began: 0.25 epoch
    assert not any(fired[:4])


def test_adaptive_weight_rule_can_stop_before_the_old_window_plus_patience() -> None:
    cfg = ScheduleConfig(window_epochs=0.2, patience_epochs=0.1, min_weight_epochs=0.1)
    rule = AdaptiveWeightStop(steps_per_epoch=10, cfg=cfg)  # window 2, patience 1, min 1
    assert [rule.update(r) for r in (0.3, 0.2)] == [False, True]


# ------------------------------------------------- the paper's parameters, stated exactly

PAPER = ScheduleConfig(window_epochs=0.2, patience_epochs=0.2, min_weight_epochs=0.2)


def _whale_end(rewards: list[float], window: int, patience: int, minimum: int) -> int | None:
    """WHALE's rule written out independently of the class: window means from the first step
    (shorter windows until full), a new best beats all earlier means strictly, and the phase ends
    at the first step t >= minimum where none of steps t - patience + 1 .. t set a new best."""
    means = [
        sum(rewards[max(0, t - window + 1) : t + 1]) / (t + 1 - max(0, t - window + 1))
        for t in range(len(rewards))
    ]
    new_best = [t == 0 or means[t] > max(means[:t]) for t in range(len(means))]
    for t in range(len(rewards)):
        step = t + 1
        if step >= minimum and step >= patience and not any(new_best[step - patience : step]):
            return step
    return None


def test_at_the_papers_parameters_a_plateau_at_a_fifth_of_an_epoch_ends_the_phase_exactly() -> None:
    """Window = minimum = patience = 0.2 epoch = 5 steps (25 steps per epoch). The reward rises
    until step 5 (0.2 epoch) and is flat after. The window mean keeps rising while it still
    holds rising steps (last new best at step 5 + 5 - 1 = 9); 5 steps later without a new best the
    phase ends: step 14, 0.56 epoch. A reward flat from the start ends it at step 6 (0.24 epoch):
    the best is set at step 1, and steps 2-6 are the patience."""
    steps_per_epoch = 25
    rule = AdaptiveWeightStop(steps_per_epoch=steps_per_epoch, cfg=PAPER)
    assert (rule.window, rule.patience, rule.min_steps) == (5, 5, 5)
    rewards = [0.2 * t for t in range(1, 6)] + [1.0] * 35
    fired = [rule.update(r) for r in rewards]
    end = fired.index(True) + 1
    assert end == _whale_end(rewards, 5, 5, 5) == 5 + 2 * 5 - 1 == 14
    assert end / steps_per_epoch == pytest.approx(0.56)

    flat = AdaptiveWeightStop(steps_per_epoch=steps_per_epoch, cfg=PAPER)
    fired = [flat.update(0.5) for _ in range(20)]
    assert fired.index(True) + 1 == _whale_end([0.5] * 20, 5, 5, 5) == 6

    # a longer minimum than patience + 1: a flat reward ends the phase at the minimum exactly
    longer = ScheduleConfig(window_epochs=0.2, patience_epochs=0.2, min_weight_epochs=0.4)
    rule = AdaptiveWeightStop(steps_per_epoch=steps_per_epoch, cfg=longer)
    fired = [rule.update(0.5) for _ in range(20)]
    assert fired.index(True) + 1 == _whale_end([0.5] * 20, 5, 5, 10) == 10


@pytest.mark.parametrize("seed", range(20))
def test_the_rule_matches_whales_statement_on_any_series(seed: int) -> None:
    import random

    rng = random.Random(seed)
    spe = rng.choice([10, 16, 25, 40])
    cfg = ScheduleConfig(
        window_epochs=rng.choice([0.05, 0.1, 0.2]),
        patience_epochs=rng.choice([0.05, 0.1, 0.2]),
        min_weight_epochs=rng.choice([0.05, 0.2, 0.3]),
    )
    rewards = [round(rng.random(), 1) for _ in range(60)]
    rule = AdaptiveWeightStop(steps_per_epoch=spe, cfg=cfg)
    fired = [rule.update(r) for r in rewards]
    end = fired.index(True) + 1 if any(fired) else None
    assert end == _whale_end(rewards, rule.window, rule.patience, rule.min_steps)


def _adaptive_run(rewards: list[float], total_epochs: float, phases: int, spe: float,
                  cap: float = 0.0) -> list[int]:
    """Steps each adaptive weight phase takes: the rule ends it, or its share of the budget."""
    used, out, it = 0, [], iter(rewards)
    for _ in range(phases):
        budget = adaptive_weight_steps(total_epochs, spe, used, cap)
        rule = AdaptiveWeightStop(steps_per_epoch=spe, cfg=PAPER)
        taken = 0
        while taken < budget:
            taken += 1
            if rule.update(next(it)):
                break
        used += taken
        out.append(taken)
    return out


def test_adaptive_phases_never_sum_past_the_total_weight_budget() -> None:
    # the README's math seed 1: 16 steps per epoch, a 0.75-epoch (12-step) total, 3 phases; the
    # first two used all 12 steps and the last was given "at least one": 13
    spe = 16
    assert adaptive_weight_steps(0.75, spe, 12) == 0
    assert adaptive_weight_steps(0.75, spe, 7) == 5
    assert adaptive_weight_steps(0.75, spe, 0, cap_epochs=0.3) == 5
    assert adaptive_weight_steps(0.75, spe, 10, cap_epochs=0.3) == 2
    assert adaptive_weight_steps(0.75, spe, 14) == 0  # never negative
    rising = [0.05 * i for i in range(40)]  # never plateaus: the budget ends every phase
    assert _adaptive_run(rising, 0.75, 3, spe) == [12, 0, 0]
    import random

    for seed in range(50):
        rng = random.Random(seed)
        rewards = [rng.random() for _ in range(200)]
        total = rng.choice([0.5, 0.75, 1.0, 1.2])
        per_epoch = rng.choice([10, 16, 25])
        steps = _adaptive_run(rewards, total, rng.choice([2, 3, 4]), per_epoch,
                              cap=rng.choice([0.0, 0.3]))
        assert sum(steps) <= round(total * per_epoch), (seed, steps)
