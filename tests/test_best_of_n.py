"""The best-of-N control: catalogue draws that read no score, spending harness-only's proposals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from test_search_rules import (
    _archive,
    _request,
    h0,
    t_search_format,
    t_search_one_search,
    t_search_truncated,
    t_search_turn_cap,
)

from whale_lab.config import ScheduleConfig, load_config
from whale_lab.engine.schedules import SCHEDULES, plan, proposal_budget
from whale_lab.search.proposers.rules import CATALOG
from whale_lab.search.proposers.rules.draw import DrawProposer

TRACES = t_search_format() + t_search_truncated() + t_search_turn_cap() + t_search_one_search()


def test_best_of_n_is_one_drawing_harness_phase_with_harness_only_budget() -> None:
    cfg = ScheduleConfig(kind="best-of-n", total_harness_iterations=4)
    (phase,) = plan(cfg)
    assert (phase.kind, phase.budget, phase.draws) == ("harness", 4.0, True)
    only = plan(dataclasses.replace(cfg, kind="harness-only"))
    assert not only[0].draws
    assert (
        proposal_budget(cfg, 3)
        == proposal_budget(dataclasses.replace(cfg, kind="harness-only"), 3)
        == 9
    )


def test_draws_are_seeded_spread_over_the_catalogue_and_built_on_the_incoming(
    tmp_path: Path,
) -> None:
    archive = _archive(tmp_path / "a", "search", TRACES, rate=0.25)
    first = DrawProposer(seed=0).propose(_request(archive, "search", n=3))
    again = DrawProposer(seed=0).propose(_request(archive, "search", n=3))
    assert [c.mechanism for c in first.candidates] == [c.mechanism for c in again.candidates]
    assert len({c.mechanism for c in first.candidates}) == 3
    assert all(c.parent_id == "c000" for c in first.candidates)
    assert all("no score read" in c.hypothesis for c in first.candidates)
    assert {c.mechanism for c in first.candidates} <= {m.name for m in CATALOG}
    # over seeds the draws differ: a draw is luck, not the rules proposer's ranking
    orders = {
        tuple(
            c.mechanism
            for c in DrawProposer(seed=s).propose(_request(archive, "search", n=3)).candidates
        )
        for s in range(8)
    }
    assert len(orders) > 1


def test_draws_never_read_a_score(tmp_path: Path) -> None:
    """The same archive with the earlier draws' scores swapped yields the same next draws."""
    sessions = []
    for swap in (False, True):
        archive = _archive(tmp_path / f"s{swap}", "search", TRACES, rate=0.25)
        first = DrawProposer(seed=1).propose(_request(archive, "search", n=2))
        ids = [
            archive.add_candidate(
                c.code,
                parent_id=c.parent_id,
                hypothesis=c.hypothesis,
                surface=c.surface,
                proposer="draw",
                iteration=2,
                mechanism=c.mechanism,
            )
            for c in first.candidates
        ]
        for cid, rate in zip(ids, (0.9, 0.0) if swap else (0.0, 0.9), strict=True):
            archive.write_json(cid, "scores", {"success_rate": rate, "mean_turns": 2.0})
            archive.set_status(cid, "evaluated")
        sessions.append(DrawProposer(seed=1).propose(_request(archive, "search", n=2, iteration=3)))
    a, b = ([(c.mechanism, c.parent_id) for c in s.candidates] for s in sessions)
    assert a == b and a
    # drawn without replacement on the incoming harness
    assert not {m for m, p in a if p == "c000"} & {c.mechanism for c in first.candidates}


def test_a_spent_catalogue_stacks_on_an_earlier_draw_and_says_when_short(tmp_path: Path) -> None:
    archive = _archive(tmp_path, "search", TRACES, rate=0.25)
    seen: list[str] = []
    for it in range(2, 12):
        session = DrawProposer(seed=2).propose(_request(archive, "search", n=3, iteration=it))
        for c in session.candidates:
            archive.add_candidate(
                c.code,
                parent_id=c.parent_id,
                hypothesis=c.hypothesis,
                surface=c.surface,
                proposer="draw",
                iteration=it,
                mechanism=c.mechanism,
            )
            seen.append(c.parent_id)
        if len(session.candidates) < 3:
            assert "draws had an untried mechanism" in session.note
            break
    assert "c000" in seen and any(p != "c000" for p in seen)
    assert h0("search") != archive.code(archive.ids()[-1])


@pytest.mark.parametrize(
    ("name", "proposals"),
    [("compare.toml", 6), ("compare-12.toml", 12), ("compare-h64.toml", 6), ("compare-chess.toml", 6)],
)
def test_the_shipped_comparisons_give_every_harness_schedule_the_same_proposals(
    name: str, proposals: int
) -> None:
    path = Path(__file__).resolve().parents[1] / "docs" / "results" / name
    cfg = load_config(str(path), [])
    if name == "compare-h64.toml":  # the 6-proposal comparison with more harness tasks, only
        base = load_config(str(path.with_name("compare.toml")), [])
        assert cfg.domain.splits.harness == 64 and base.domain.splits.harness == 16
        assert dataclasses.replace(cfg.domain.splits, harness=16) == base.domain.splits
        assert cfg.schedule == base.schedule and cfg.sampling == base.sampling
    if name == "compare-chess.toml":  # compare-h64's budgets, with larger val and test splits
        base = load_config(str(path.with_name("compare-h64.toml")), [])
        assert (cfg.domain.splits.val, cfg.domain.splits.test) == (64, 64)
        assert dataclasses.replace(cfg.domain.splits, val=24, test=24) == base.domain.splits
        assert cfg.schedule == base.schedule and cfg.sampling == base.sampling
    m = cfg.harness_search.candidates_per_iteration
    budgets = {k: proposal_budget(dataclasses.replace(cfg.schedule, kind=k), m) for k in SCHEDULES}
    assert budgets["weight-only"] == 0
    assert {v for k, v in budgets.items() if k != "weight-only"} == {proposals}
