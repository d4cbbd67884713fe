"""Evaluation that costs what it must: test is scored only where val reaches a new best.

Under `eval.test_every = "best"` (the default) an evaluation point scores val, and test only when
that val is a new best of the run, so the checkpoint selected on val always has its test score
and the other points cost val alone. `"always"` keeps the paper-style best-on-test figure over
every point. Scores do not move: each split keeps its own sampling seed either way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from engine_support import ApproveAll, ParityDomain, engine_config, write_harness

from whale_lab import events as ev
from whale_lab.backends import make_backend
from whale_lab.config import ConfigError, load_config
from whale_lab.context import Evaluator
from whale_lab.engine.engine import Engine
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.probe import val_params
from whale_lab.engine.report import summarise_run, write_comparison
from whale_lab.metrics import reaches_best
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json


def _run(folder: Path, test_every: str) -> Path:
    folder.mkdir()
    cfg = engine_config(folder, eval={"test_every": test_every}, rsft={"eval_every": 0.25})
    store = RunStore(folder / "run")
    engine = Engine(
        cfg,
        store,
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=make_backend(cfg),
        domain=ParityDomain(),
    )
    engine.run()
    store.close()
    return store.root


def _points(root: Path) -> list[tuple[str, str, float]]:
    """(checkpoint relative to the run, split, mean@k) of every evaluation result, in order."""
    return [
        (Path(e.checkpoint).relative_to(root).as_posix(), e.split, e.mean_at_k)
        for e in RunStore.read_events(root)
        if isinstance(e, ev.EvalResult)
    ]


def test_test_is_scored_only_at_new_bests_on_val_and_no_score_moves(tmp_path: Path) -> None:
    best_root = _run(tmp_path / "best", "best")
    always_root = _run(tmp_path / "always", "always")
    best, always = _points(best_root), _points(always_root)

    # val at every point, the same scores either way
    val = [(c, s) for c, split, s in always if split == "val"]
    assert [(c, s) for c, split, s in best if split == "val"] == val
    # test only where val is a new best of the run (the first point is one), with the same scores
    # (a tie of the best counts: the paired tie-break may choose it, so it gets its test score)
    new_best = [
        c for i, (c, s) in enumerate(val) if reaches_best(s, max((x for _, x in val[:i]), default=None))
    ]
    assert 0 < len(new_best) < len(val)  # this run has points that skip test
    test_always = {c: s for c, split, s in always if split == "test"}
    assert {c: s for c, split, s in best if split == "test"} == {c: test_always[c] for c in new_best}
    assert set(test_always) == {c for c, _ in val}

    # the selection is the same point, and it has its test score
    chosen, reference = summarise_run(best_root), summarise_run(always_root)
    assert Path(chosen.selected_checkpoint).relative_to(best_root) == Path(
        reference.selected_checkpoint
    ).relative_to(always_root)
    assert chosen.selected_val == reference.selected_val
    assert chosen.selected_test is not None and chosen.selected_test == reference.selected_test
    assert chosen.tested_points == len(new_best) and reference.tested_points == len(val)
    result = read_json(best_root / "result.json")["best"]
    assert result["test"] == chosen.selected_test
    assert result["best_on_test"] == max(test_always[c] for c in new_best)
    assert f"over the {len(new_best)} of {len(val)} evaluation points" in result["best_on_test_note"]

    # what was skipped was not run: fewer evaluation rollouts, each one counted once
    ledgers = Ledger.read(best_root), Ledger.read(always_root)
    assert ledgers[0].eval_rollouts < ledgers[1].eval_rollouts
    assert ledgers[0].weight_rollouts == ledgers[1].weight_rollouts
    episodes = [e for e in RunStore.read_events(best_root) if isinstance(e, ev.EpisodeFinished)]
    assert ledgers[0].eval_rollouts == sum(e.phase == "eval" for e in episodes)
    # each result claims its own split's episodes
    scores = chosen.episodes[chosen.selected_checkpoint]
    assert set(scores) == {"val", "test"}
    assert all(t.startswith("val-") for t in scores["val"])
    assert all(t.startswith("test-") for t in scores["test"])


def _traces(report: Any) -> list[tuple[str, int, float, str]]:
    return [(t.task_id, t.sample, t.reward, t.turns[-1].response) for t in report.traces]


def test_score_splits_scores_each_split_as_it_would_alone(tmp_path: Path) -> None:
    cfg = engine_config(tmp_path)
    domain = ParityDomain()
    evaluator = Evaluator.from_config(cfg, make_backend(cfg), domain)
    harness = write_harness(tmp_path)
    k = cfg.sampling.k
    splits = [(s, domain.tasks(s), val_params(cfg, i)) for i, s in enumerate(("val", "test"))]
    alone = {s: evaluator.score(harness, tasks, k, params) for s, tasks, params in splits}
    seen: list[str] = []
    together = evaluator.score_splits(
        harness, splits, k, sink=lambda split: seen.append(split) or None
    )
    assert list(together) == ["val", "test"] and seen == ["val", "test"]
    for split in ("val", "test"):
        assert _traces(together[split]) == _traces(alone[split])
        assert together[split].mean_at_k == alone[split].mean_at_k

    asked: list[tuple[str, list[str]]] = []

    def only_val(split: str, done: Any) -> bool:
        asked.append((split, list(done)))
        return split == "val"

    skipped = evaluator.score_splits(harness, splits, k, wanted=only_val)
    assert list(skipped) == ["val"] and asked == [("val", []), ("test", ["val"])]
    assert _traces(skipped["val"]) == _traces(alone["val"])

    stopped = evaluator.score_splits(harness, splits, k, should_stop=lambda: True)
    assert list(stopped) == ["val"] and stopped["val"].rollouts == 0  # nothing after a cut split


def test_the_weight_phase_knows_the_runs_best_val(tmp_path: Path) -> None:
    from whale_lab.context import RunContext
    from whale_lab.weights.rsft import EvalRecord, RsftPhase

    cfg = engine_config(tmp_path)
    store = RunStore(tmp_path / "run")
    phase = RsftPhase(RunContext.of(cfg, make_backend(cfg), ParityDomain(), store))
    assert phase._best_val_so_far() is None  # the first point is a new best
    for where, score in (
        (store.root / "checkpoints" / "start", 0.25),  # an engine point
        (phase.ckpt.root / "checkpoints" / "step-000003", 0.9),  # killed before it was saved
    ):
        store.emit(ev.EvalResult(split="val", cycle=1, phase="weight", mean_at_k=score,
                                 pass_at_k=score, k=2, n_tasks=2, checkpoint=str(where)))
    store.emit(ev.EvalResult(split="test", cycle=1, phase="start", mean_at_k=1.0, pass_at_k=1.0,
                             k=2, n_tasks=2, checkpoint=str(store.root / "checkpoints" / "start")))
    assert phase._best_val_so_far() == 0.25
    phase.evals.append(EvalRecord(step=1, epoch=0.25, val=0.5, test=None, checkpoint="", harness=""))
    assert phase._best_val_so_far() == 0.5
    store.close()


def _summary_run(tmp: Path) -> Path:
    """Points (val, test or None, rollouts); each point's episodes name their split's trace."""
    store = RunStore(tmp / "run")
    store.emit(ev.RunStarted(run_id="r", domain="parity", model="m", schedule="whale", harness="h"))
    points = [("a", 0.2, 0.5, 10), ("b", 0.4, 0.3, 20), ("c", 0.4, None, 15), ("d", 0.3, None, 40)]
    for key, val, test, rollouts in points:
        scored = {"val": val} if test is None else {"val": val, "test": test}
        for split in scored:
            for task in (f"{split}-0", f"{split}-1"):
                store.emit(ev.EpisodeFinished(phase="eval", task_id=task, sample=0, turns=1,
                                              reward=1.0, stop_reason="answered",
                                              trace_path=f"traces/eval-{split}.jsonl"))
        for split, score in scored.items():
            store.emit(ev.EvalResult(split=split, cycle=0, phase="weight", mean_at_k=score,
                                     pass_at_k=score, k=1, n_tasks=2, checkpoint=key,
                                     weight_rollouts=rollouts))
    store.emit(ev.RunFinished(status="completed"))
    store.close()
    return store.root


def test_the_report_reads_points_without_a_test_score(tmp_path: Path) -> None:
    s = summarise_run(_summary_run(tmp_path))
    assert [(p.checkpoint, p.test) for p in s.curve] == [
        ("a", 0.5), ("b", 0.3), ("c", None), ("d", None)
    ]
    # best on val is a tie of b and c; the one scored on test is chosen (it reached 0.4 first,
    # although c has fewer rollouts here)
    assert (s.selected_checkpoint, s.selected_val, s.selected_test) == ("b", 0.4, 0.3)
    assert (s.best_test, s.tested_points) == (0.5, 2)  # over the points that have a test score
    assert set(s.episodes["c"]) == {"val"} and set(s.episodes["b"]) == {"val", "test"}
    assert list(s.selected_scores("test")) == ["test-0", "test-1"]
    assert list(s.selected_scores("val")) == ["val-0", "val-1"]
    text = write_comparison(tmp_path / "report", [s]).read_text(encoding="utf-8")
    assert "best on test (paper's way) over tested points" in text
    assert "evaluation points scored on test" in text


def test_eval_test_every_is_checked() -> None:
    assert load_config(None, []).eval.test_every == "best"
    assert load_config(None, ['eval.test_every="always"']).eval.test_every == "always"
    with pytest.raises(ConfigError) as err:
        load_config(None, ['eval.test_every="sometimes"'])
    assert "eval.test_every: expected one of 'best', 'always', got 'sometimes'" in str(err.value)
    with pytest.raises(ConfigError, match="did you mean 'eval.test_every'"):
        load_config(None, ["eval.test_evry=best"])
