"""Comparison reports are derived from run folders: val-selected test scores, intervals, plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale_lab import events as ev
from whale_lab.engine.report import mean_ci, summarise_run, write_comparison
from whale_lab.store import RunStore


def _run(tmp: Path, name: str, schedule: str, seed: int, points: list[tuple[float, float]]) -> Path:
    store = RunStore(tmp / name)
    store.emit(
        ev.RunStarted(
            run_id=name,
            domain="math",
            model="micro",
            schedule=schedule,
            harness="h0",
            config={"run": {"seed": seed}},
        )
    )
    for i, (val, test) in enumerate(points):
        for split, score in (("val", val), ("test", test)):
            store.emit(
                ev.EvalResult(
                    split=split,
                    cycle=i,
                    phase="weight",
                    mean_at_k=score,
                    pass_at_k=score,
                    k=8,
                    n_tasks=10,
                    checkpoint=f"c{i}",
                    weight_rollouts=100 * (i + 1),
                    harness_rollouts=10 * i,
                )
            )
    store.emit(
        ev.ProposerUsage(
            proposer="llm", prompt_tokens=50, completion_tokens=5, cost=0.0, seconds=1.0
        )
    )
    store.emit(ev.RunFinished(status="completed"))
    store.close()
    return store.root


def test_selection_uses_val_not_test(tmp_path: Path) -> None:
    root = _run(tmp_path, "a", "whale", 0, [(0.2, 0.5), (0.4, 0.3), (0.4, 0.35)])
    s = summarise_run(root)
    # best val is 0.4; the tie goes to the earlier checkpoint, so the reported test score is 0.3
    assert s.selected_checkpoint == "c1" and s.selected_test == pytest.approx(0.3)
    assert s.best_test == pytest.approx(0.5)  # the paper's best-on-test figure
    assert (s.weight_rollouts, s.harness_rollouts, s.proposer_tokens) == (300, 20, 55)
    assert [p.rollouts for p in s.curve] == [100, 210, 320]


def test_mean_ci() -> None:
    m, h = mean_ci([0.2, 0.4, 0.6])
    assert m == pytest.approx(0.4)
    assert h == pytest.approx(4.303 * 0.2 / 3**0.5)
    assert mean_ci([0.5]) == (0.5, 0.0)


def test_comparison_report_files(tmp_path: Path) -> None:
    runs = [
        summarise_run(_run(tmp_path, f"{s}{seed}", s, seed, [(0.1 * seed, 0.1 * seed + 0.1)]))
        for s in ("whale", "weight-only")
        for seed in (1, 2)
    ]
    md = write_comparison(tmp_path / "report", runs)
    text = md.read_text()
    assert "| whale | 2 |" in text and "| weight-only | 2 |" in text
    assert "best on test (paper's way)" in text
    for f in ("accuracy_vs_rollouts.png", "accuracy_vs_rollouts.svg", "results.json"):
        assert (tmp_path / "report" / f).stat().st_size > 0
    assert (tmp_path / "report" / "accuracy_vs_rollouts.png").read_bytes()[:4] == b"\x89PNG"


def _run_with_episodes(
    tmp: Path, name: str, schedule: str, seed: int, rewards: dict[str, list[float]]
) -> Path:
    """One evaluation point whose test episodes have the given per-task rewards."""
    store = RunStore(tmp / name)
    store.emit(
        ev.RunStarted(
            run_id=name,
            domain="math",
            model="micro",
            schedule=schedule,
            harness="h0",
            config={"run": {"seed": seed}},
        )
    )
    for split in ("val", "test"):
        for task, rs in rewards.items():
            for i, r in enumerate(rs):
                store.emit(
                    ev.EpisodeFinished(
                        phase="eval",
                        task_id=task,
                        sample=i,
                        turns=1,
                        reward=r,
                        stop_reason="answered",
                    )
                )
        mean = sum(sum(v) for v in rewards.values()) / sum(len(v) for v in rewards.values())
        store.emit(
            ev.EvalResult(
                split=split,
                cycle=0,
                phase="start",
                mean_at_k=mean,
                pass_at_k=mean,
                k=2,
                n_tasks=len(rewards),
                checkpoint="c0",
            )
        )
    store.emit(ev.RunFinished(status="completed"))
    store.close()
    return store.root


def test_the_report_pairs_schedules_on_the_same_seeds_and_tasks(tmp_path: Path) -> None:
    import json

    tasks = [f"t{i}" for i in range(30)]
    runs = []
    for seed in (0, 1):
        base = {t: [0.0, 0.0] if i % 2 else [1.0, 0.0] for i, t in enumerate(tasks)}
        better = {t: [1.0, 1.0] for t in tasks}  # wins on every task
        same = {t: list(v) for t, v in base.items()}  # identical to the baseline
        runs.append(
            summarise_run(_run_with_episodes(tmp_path, f"w{seed}", "weight-only", seed, base))
        )
        runs.append(summarise_run(_run_with_episodes(tmp_path, f"h{seed}", "whale", seed, better)))
        runs.append(
            summarise_run(_run_with_episodes(tmp_path, f"p{seed}", "prompt-only", seed, same))
        )
    assert runs[0].selected_scores() == {
        t: ([0.0, 0.0] if i % 2 else [1.0, 0.0]) for i, t in enumerate(tasks)
    }
    md = write_comparison(tmp_path / "report", runs)
    paired = json.loads((tmp_path / "report" / "paired.json").read_text())
    rows = {(p["schedule"], p["baseline"]): p for p in paired["pairs"]}
    # fixed splits: every seed scored the same 30 tasks, so a task (pooled over seeds) is a unit
    assert paired["unit"].startswith("test task (samples pooled over the seeds)")
    win = rows[("whale", "weight-only")]
    assert win["n_tasks"] == 30 and win["excludes_zero"] and win["low"] > 0
    assert win["diff"] == pytest.approx(0.75) and win["wins"] == 30
    tie = rows[("prompt-only", "weight-only")]
    assert tie["diff"] == 0 and not tie["excludes_zero"] and tie["ties"] == 30
    text = md.read_text()
    assert "Paired differences" in text and "no difference detected at this size" in text
    assert "| whale | weight-only | +75.0 |" in text
    results = json.loads((tmp_path / "report" / "results.json").read_text())
    assert "episodes" not in results["runs"][0]


def _tied_run(tmp: Path, points: list[tuple[str, dict[str, list[float]], bool]]) -> Path:
    """Evaluation points with per-task val episodes; each (checkpoint, rewards, scored on test)."""
    store = RunStore(tmp / "tied")
    store.emit(
        ev.RunStarted(
            run_id="tied",
            domain="math",
            model="micro",
            schedule="whale",
            harness="h0",
            config={"run": {"seed": 0}},
        )
    )
    for i, (ckpt, rewards, tested) in enumerate(points):
        for task, rs in rewards.items():
            for j, r in enumerate(rs):
                store.emit(
                    ev.EpisodeFinished(
                        phase="eval",
                        task_id=task,
                        sample=j,
                        turns=1,
                        reward=r,
                        stop_reason="answered",
                        trace_path="traces/eval-val.jsonl",
                    )
                )
        mean = sum(sum(v) for v in rewards.values()) / sum(len(v) for v in rewards.values())
        splits = [("val", mean)] + ([("test", 0.1 * (i + 1))] if tested else [])
        for split, score in splits:
            store.emit(
                ev.EvalResult(
                    split=split,
                    cycle=i,
                    phase="weight",
                    mean_at_k=score,
                    pass_at_k=score,
                    k=3,
                    n_tasks=len(rewards),
                    checkpoint=ckpt,
                    weight_rollouts=100 * (i + 1),
                )
            )
    store.emit(ev.RunFinished(status="completed"))
    store.close()
    return store.root


# Two val score sets with the same mean (3 of 12): A is right on one task every time, B once on
# each of three tasks; B wins three tasks and loses one against A.
_A = {"t0": [1.0, 1.0, 1.0], "t1": [0.0, 0.0, 0.0], "t2": [0.0, 0.0, 0.0], "t3": [0.0, 0.0, 0.0]}
_B = {"t0": [0.0, 0.0, 0.0], "t1": [1.0, 0.0, 0.0], "t2": [0.0, 1.0, 0.0], "t3": [0.0, 0.0, 1.0]}


def test_a_val_tie_goes_to_the_later_point_that_wins_more_val_tasks(tmp_path: Path) -> None:
    s = summarise_run(_tied_run(tmp_path, [("c0", _A, True), ("c1", _B, True)]))
    assert s.selected_checkpoint == "c1" and s.selected_test == pytest.approx(0.2)
    assert "val tie at 25.00 among 2 points" in s.selection_rule
    assert "c1 over c0: 3 wins / 1 losses / 0 ties on 4 val tasks" in s.selection_rule


def test_a_val_tie_stays_with_the_earlier_point_when_the_later_wins_fewer(tmp_path: Path) -> None:
    s = summarise_run(_tied_run(tmp_path, [("c0", _B, True), ("c1", _A, True)]))
    assert s.selected_checkpoint == "c0" and s.selected_test == pytest.approx(0.1)
    assert "c0 over c1: 1 wins / 3 losses" in s.selection_rule


def test_an_untested_tie_is_left_out_and_the_rule_says_so(tmp_path: Path) -> None:
    # eval.test_every = "best": the later tie was not a new best, so it has no test score
    s = summarise_run(_tied_run(tmp_path, [("c0", _A, True), ("c1", _B, False)]))
    assert s.selected_checkpoint == "c0" and s.selected_test == pytest.approx(0.1)
    assert "1 tied point(s) without a test score left out" in s.selection_rule


def test_no_tie_names_the_plain_rule(tmp_path: Path) -> None:
    s = summarise_run(_tied_run(tmp_path, [("c0", _A, True), ("c1", {"t0": [1.0] * 3}, True)]))
    assert s.selected_checkpoint == "c1" and s.selection_rule == "best on val"


def test_with_redrawn_splits_a_seed_and_task_pair_is_the_unit(tmp_path: Path) -> None:
    import json

    runs = []
    for seed in (0, 1):
        tasks = [f"s{seed}t{i}" for i in range(10)]  # each seed drew its own tasks
        base = {t: [0.0, 0.0] for t in tasks}
        better = {t: [1.0, 0.0] for t in tasks}
        runs.append(
            summarise_run(_run_with_episodes(tmp_path, f"w{seed}", "weight-only", seed, base))
        )
        runs.append(summarise_run(_run_with_episodes(tmp_path, f"h{seed}", "whale", seed, better)))
    write_comparison(tmp_path / "report", runs)
    paired = json.loads((tmp_path / "report" / "paired.json").read_text())
    assert paired["unit"].startswith("(seed, test task)")
    (pair,) = paired["pairs"]
    assert pair["n_tasks"] == 20 and pair["wins"] == 20 and pair["diff"] == pytest.approx(0.5)
