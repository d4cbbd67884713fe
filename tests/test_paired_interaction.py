"""The interaction of a 2 x 2 paired design on constructed data: a known interaction, a known
null, invalid episodes, and the words the probe prints."""

from __future__ import annotations

import pytest

from whale_lab.engine.interaction import describe, verdict_of
from whale_lab.paired import interaction_effect

TASKS = [f"t{i}" for i in range(40)]


def _scores(values: list[float]) -> dict[str, list[float | None]]:
    return {t: [v] for t, v in zip(TASKS, values, strict=True)}


def test_a_harness_that_helps_only_after_the_weight_update_is_a_positive_interaction() -> None:
    inc_before = _scores([0.5] * 40)
    cand_before = _scores([0.5] * 40)  # no gain before
    inc_after = _scores([0.5] * 40)
    cand_after = _scores([1.0 if i % 2 else 0.75 for i in range(40)])  # +0.375 after
    r = interaction_effect(inc_before, cand_before, inc_after, cand_after)
    assert r.n_tasks == 40
    assert r.gain_0.diff == pytest.approx(0.0) and r.gain_1.diff == pytest.approx(0.375)
    assert r.interaction.diff == pytest.approx(0.375)
    assert r.interaction.low > 0 and verdict_of(r) == "positive"
    assert r.cells == pytest.approx({"a0": 0.5, "b0": 0.5, "a1": 0.5, "b1": 0.875})
    assert "helps more after the weight update" in describe(r)


def test_the_same_gain_under_both_weights_is_no_interaction() -> None:
    # the candidate gains on the same noisy pattern before and after: the interaction is zero
    noise = [(-0.25, 0.25, 0.5, 0.0)[i % 4] for i in range(40)]
    inc = _scores([0.25] * 40)
    cand = _scores([0.25 + n for n in noise])
    r = interaction_effect(inc, cand, inc, cand)
    assert r.gain_0.diff == pytest.approx(r.gain_1.diff) and r.gain_0.diff > 0
    assert r.interaction.diff == pytest.approx(0.0) and r.interaction.ties == 40
    assert verdict_of(r) == "inconclusive"
    assert "Inconclusive: no interaction detected at this size" in describe(r)
    assert "the same under both weights on all 40 tasks" in describe(r)


def test_a_noisy_small_interaction_is_inconclusive_with_a_needed_size() -> None:
    after = [0.5 + (0.5 if i % 3 == 0 else -0.2) for i in range(12)]  # mean +0.033, wide spread
    inc = {t: [0.5] for t in TASKS[:12]}
    cand_before = {t: [0.5] for t in TASKS[:12]}
    cand_after = {t: [v] for t, v in zip(TASKS[:12], after, strict=True)}
    r = interaction_effect(inc, cand_before, inc, cand_after)
    assert r.interaction.low < 0 < r.interaction.high
    assert verdict_of(r) == "inconclusive"
    need = r.interaction.needed_tasks()
    assert need is not None and need > 12
    assert f"about {need} val tasks would resolve" in describe(r)


def test_a_task_invalid_in_one_cell_leaves_all_four() -> None:
    inc = _scores([0.0] * 40)
    cand = _scores([1.0] * 40)
    broken = dict(cand)
    broken["t0"] = [None]  # a backend error: invalid, not a zero
    r = interaction_effect(inc, cand, inc, broken)
    assert r.n_tasks == 39 and r.interaction.invalid_tasks == 1
    assert r.interaction.diff == pytest.approx(0.0)
    assert r.to_dict()["interaction"]["invalid_tasks"] == 1
