"""Paired statistics on constructed data: a known difference is found, a known null is not."""

from __future__ import annotations

import random

import pytest

from whale_lab.paired import (
    METHOD,
    needed_tasks,
    paired_difference,
    scores_by_task,
)


def _arms(n: int, p_a: float, p_b: float, k: int, seed: int) -> tuple[dict, dict]:
    rng = random.Random(seed)
    a, b = {}, {}
    for i in range(n):
        difficulty = rng.random() - 0.5  # shared per task: what pairing removes
        pa = min(1.0, max(0.0, p_a + difficulty))
        pb = min(1.0, max(0.0, p_b + difficulty))
        a[f"t{i}"] = [float(rng.random() < pa) for _ in range(k)]
        b[f"t{i}"] = [float(rng.random() < pb) for _ in range(k)]
    return a, b


def test_a_real_difference_is_detected_with_its_interval() -> None:
    a, b = _arms(200, 0.3, 0.5, 4, seed=1)
    r = paired_difference(a, b)
    assert r.n_tasks == 200 and r.method == METHOD
    assert r.low > 0.1 and r.high < 0.3 and r.low < r.diff < r.high
    assert r.excludes_zero and r.verdict() == "better" and r.wins > r.losses
    assert "no difference detected" not in r.describe()


def test_a_null_difference_is_inconclusive_with_a_needed_size() -> None:
    a, b = _arms(40, 0.4, 0.4, 2, seed=2)
    r = paired_difference(a, b)
    assert r.low < 0 < r.high and not r.excludes_zero
    assert r.verdict() == "inconclusive"
    text = r.describe(unit=" pts", scale=100)
    assert "no difference detected at this size" in text
    assert r.needed_tasks(0.05) is not None and r.needed_tasks(0.05) > 40


def test_swapping_arms_negates_the_difference() -> None:
    a, b = _arms(60, 0.5, 0.2, 4, seed=3)
    ab, ba = paired_difference(a, b), paired_difference(b, a)
    assert ab.diff == pytest.approx(-ba.diff)
    assert ab.verdict() == "worse" and ba.verdict() == "better"
    assert (ab.wins, ab.losses) == (ba.losses, ba.wins)


def test_invalid_episodes_are_left_out_not_scored_zero() -> None:
    a = {"t1": [1.0, 1.0], "t2": [0.0, 1.0], "t3": [None, None]}
    b = {"t1": [1.0, None], "t2": [1.0, 1.0], "t3": [1.0, 1.0]}
    r = paired_difference(a, b)
    assert r.n_tasks == 2 and r.invalid_tasks == 1  # t3 has no valid score in arm a
    assert r.mean_a == pytest.approx(0.75) and r.mean_b == pytest.approx(1.0)


def test_a_handful_of_tasks_never_supports_a_verdict() -> None:
    a = {f"t{i}": [0.0] for i in range(3)}
    b = {f"t{i}": [1.0] for i in range(3)}
    r = paired_difference(a, b)
    assert r.diff == 1.0 and r.verdict() == "inconclusive" and not r.excludes_zero


def test_the_bootstrap_is_deterministic_for_a_seed() -> None:
    a, b = _arms(30, 0.3, 0.4, 2, seed=4)
    assert paired_difference(a, b, seed=7) == paired_difference(a, b, seed=7)


def test_needed_tasks_follows_the_normal_approximation() -> None:
    assert needed_tasks(0.5, 0.1) == 197  # (1.96 + 0.8416)^2 * 25 = 196.2
    assert needed_tasks(0.0, 0.1) is None and needed_tasks(0.5, 0.0) is None


def test_scores_by_task_marks_backend_errors_invalid() -> None:
    traces = [
        {"task_id": "a", "reward": 1.0, "stop_reason": "answered"},
        {"task_id": "a", "reward": 0.0, "stop_reason": "backend_error"},
        {"task_id": "b", "reward": 0.0, "stop_reason": "turn_cap"},
    ]
    assert scores_by_task(traces) == {"a": [1.0, None], "b": [0.0]}


def test_a_bound_at_zero_up_to_rounding_does_not_exclude_zero() -> None:
    """Pooled per-task means leave bounds like 1e-18 where the bootstrap's is exactly 0."""
    from whale_lab.paired import PairedResult

    r = PairedResult(24, 0.1, 0.15, 0.05, 1.2e-18, 0.1, 12, 4, 8, sd=0.1)
    assert not r.excludes_zero and r.verdict() == "inconclusive"
    assert PairedResult(24, 0.1, 0.15, 0.05, 0.003, 0.1, 12, 4, 8, sd=0.1).excludes_zero
    worse = PairedResult(24, 0.15, 0.1, -0.05, -0.1, -1.2e-18, 4, 12, 8, sd=0.1)
    assert not worse.excludes_zero and worse.verdict() == "inconclusive"


def test_a_difference_of_zero_up_to_rounding_names_no_needed_size() -> None:
    from whale_lab.paired import needed_tasks

    assert needed_tasks(0.1, 1e-17) is None
    assert needed_tasks(0.1, 0.05) == 32
