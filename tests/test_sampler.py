"""The persistent prompt sampler: seeded order, no revisit within an epoch, exact resume."""

from __future__ import annotations

import json

import pytest

from whale_lab.weights.sampler import PromptSampler, SamplerStateError

IDS = [f"t{i}" for i in range(10)]


def test_each_epoch_is_a_permutation_and_no_prompt_comes_back_early() -> None:
    s = PromptSampler(IDS, seed=3)
    drawn = []
    for _ in range(10):  # 10 draws of 3 = 3 epochs exactly
        drawn.extend(s.draw(3))
    for e in range(3):
        assert sorted(drawn[e * 10 : (e + 1) * 10]) == list(range(10))
    assert s.epoch == 3 and s.offset == 0
    assert s.epochs_done == pytest.approx(3.0)


def test_a_batch_spanning_the_end_of_an_epoch_finishes_it_first() -> None:
    s = PromptSampler(IDS, seed=0)
    first = s.draw(8)
    across = s.draw(4)  # 2 left in epoch 0, then 2 from epoch 1
    assert sorted(first + across[:2]) == list(range(10))
    assert across[2:] == s.order(1)[:2]
    assert (s.epoch, s.offset) == (1, 2)


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b, c = PromptSampler(IDS, seed=1), PromptSampler(IDS, seed=1), PromptSampler(IDS, seed=2)
    assert a.draw(10) == b.draw(10)
    assert a.order(0) != c.order(0)
    assert a.order(0) != a.order(1)


def test_resume_continues_exactly_where_it_stopped() -> None:
    ref = PromptSampler(IDS, seed=5)
    full = [ref.draw(3) for _ in range(7)]

    s = PromptSampler(IDS, seed=5)
    for _ in range(4):
        s.draw(3)
    saved = json.loads(json.dumps(s.state_dict()))  # through JSON, as in state files
    fresh = PromptSampler(IDS, seed=5)
    fresh.load_state_dict(saved)
    assert [fresh.draw(3) for _ in range(3)] == full[4:]
    assert fresh.drawn == 21


def test_resume_against_another_split_or_seed_is_refused() -> None:
    s = PromptSampler(IDS, seed=5)
    s.draw(4)
    state = s.state_dict()
    with pytest.raises(SamplerStateError, match="different weight split"):
        PromptSampler(IDS[:-1], seed=5).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="seed"):
        PromptSampler(IDS, seed=6).load_state_dict(state)
    with pytest.raises(SamplerStateError, match="incomplete"):
        PromptSampler(IDS, seed=5).load_state_dict({"epoch": 1})


def test_empty_or_duplicate_splits_are_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        PromptSampler([])
    with pytest.raises(ValueError, match="duplicate"):
        PromptSampler(["a", "a"])
