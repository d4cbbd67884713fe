"""A later evaluation point that ties the best val is scored on test, and the tie rule decides.

Under `eval.test_every = "best"` test used to be scored only at a new best on val, so a later
point tying the best had no test score and the paired val tie-break could never pick it (reports
said "1 tied point(s) without a test score left out"). Here two harnesses give the same val
mean@k task by task differently: the later one wins 2 val tasks and loses 1. The run's real
evaluation points score both on test, and `select_on_val` picks the later one on val alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine_support import ApproveAll, engine_config

from whale_lab import events as ev
from whale_lab.backends import make_backend
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task
from whale_lab.engine.engine import Engine
from whale_lab.engine.evaluation import EvaluationPoints
from whale_lab.engine.report import summarise_run
from whale_lab.metrics import reaches_best
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore

# reward of each answer on each task: "A" and "B" tie on val (1/3 each), B wins v1 and v2 by
# half a point and loses v0 by a whole one; on test they differ (A 0, B 1)
REWARDS: dict[str, dict[str, float]] = {
    "A": {"val-0": 1.0, "val-1": 0.0, "val-2": 0.0, "test-0": 0.0, "test-1": 0.0, "test-2": 0.0},
    "B": {"val-0": 0.0, "val-1": 0.5, "val-2": 0.5, "test-0": 1.0, "test-1": 1.0, "test-2": 1.0},
}


class TableEnv(Env):
    def __init__(self, task: Task) -> None:
        self.task = task

    def initial_observation(self) -> Any:
        return None

    def context(self) -> dict[str, Any]:
        return {}

    def step(self, action: Action) -> StepOutcome:
        reward = REWARDS.get(action.value, {}).get(self.task.id, 0.0)
        return StepOutcome(done=True, reward=reward, stop_reason="answered")


class TableDomain(Domain):
    """Tasks whose reward is set by the answer the harness's parser gives (a fixed letter)."""

    name = "table"

    def tasks(self, split: Split) -> list[Task]:
        return [
            Task(id=f"{split}-{i}", domain="table", fields={"question": f"{split} {i}"}, answer=0)
            for i in range(3 if split in ("val", "test") else 2)
        ]

    def make_env(self, task: Task) -> TableEnv:
        return TableEnv(task)

    def normalise_action(self, raw: Any) -> Action:
        return Action(kind="answer", value=str(raw or "").strip())


assert set(SPLITS) >= {"val", "test"}


def _harness(folder: Path, letter: str) -> Path:
    path = folder / f"answer_{letter}.py"
    path.write_text(
        'USER_PROMPT = "{question}"\nMAX_TURNS = 1\n\n\n'
        f"def parse_action(response: str) -> str:\n    return {letter!r}\n",
        encoding="utf-8",
    )
    return path


def test_reaches_best_takes_ties() -> None:
    assert reaches_best(0.5, None) and reaches_best(0.6, 0.5) and reaches_best(0.5, 0.5)
    assert reaches_best(1 / 3, (0.0 + 0.5 + 0.5) / 3)  # equal up to rounding
    assert not reaches_best(0.4, 0.5)


def test_a_val_tie_is_scored_on_test_and_the_paired_tie_break_picks_the_later(
    tmp_path: Path,
) -> None:
    cfg = engine_config(
        tmp_path,
        schedule={"kind": "harness-only"},
        eval={"test_every": "best"},
        sampling={"k": 1},
    )
    store = RunStore(tmp_path / "run")
    engine = Engine(
        cfg,
        store,
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=make_backend(cfg),
        domain=TableDomain(),
    )
    store.emit(ev.RunStarted(run_id="r", domain="table", model="m", schedule="harness-only",
                             harness="answer_A"))
    book = engine.book
    points = EvaluationPoints(engine.ctx, book, engine.points)
    harness_a, harness_b = _harness(tmp_path, "A"), _harness(tmp_path, "B")
    worse = tmp_path / "answer_C.py"  # no reward anywhere
    worse.write_text(harness_b.read_text().replace("'B'", "'C'"), encoding="utf-8")

    for key, harness in (("start", harness_a), ("p00-c1-harness", worse),
                         ("p01-c1-harness", harness_b)):
        book.state.harness = str(harness)
        assert points.evaluate_point(1, "harness", key)
    store.emit(ev.RunFinished(status="completed"))
    store.close()

    results = [
        (Path(e.checkpoint).name, e.split, e.mean_at_k)
        for e in RunStore.read_events(store.root)
        if isinstance(e, ev.EvalResult)
    ]
    third = 1 / 3
    # the first point is a best (test scored); the worse one is not; the tie is scored on test
    assert [(c, s) for c, s, _ in results] == [
        ("start", "val"), ("start", "test"),
        ("p00-c1-harness", "val"),
        ("p01-c1-harness", "val"), ("p01-c1-harness", "test"),
    ]
    vals = {c: m for c, s, m in results if s == "val"}
    assert abs(vals["start"] - third) < 1e-12 and abs(vals["p01-c1-harness"] - third) < 1e-12

    s = summarise_run(store.root)
    assert Path(s.selected_checkpoint).name == "p01-c1-harness"
    assert s.selected_test == 1.0  # the later point's own test score, known
    assert "p01-c1-harness over start: 2 wins / 1 losses / 0 ties on 3 val tasks" in (
        s.selection_rule
    )
    assert "left out" not in s.selection_rule
    assert s.tested_points == 2
