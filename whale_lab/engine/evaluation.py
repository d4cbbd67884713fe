"""Evaluation points and their checkpoints: val and test of the weights and harness in force.

Every point scores val; test (which only feeds the report) is scored under the same checkpoint
key where `eval.test_every` asks for it: by default only at points whose val is a new best of
the run or ties it (`metrics.reaches_best`), so the checkpoint the selection picks on val, the
paired tie-break included, always has its test score beside it; `"always"` scores it everywhere. A point whose weights and harness are those of the last one is
skipped (it would measure the same thing again).
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path

from whale_lab.context import RunContext
from whale_lab.engine.probe import val_params
from whale_lab.engine.runbook import RunBook, file_sha
from whale_lab.engine.safepoints import SafePoints
from whale_lab.events import EvalResult, Log
from whale_lab.metrics import reaches_best
from whale_lab.store import atomic_write_json


class EvaluationPoints:
    """Runs the engine's evaluation points and keeps their checkpoints in `checkpoints/<key>/`."""

    def __init__(self, ctx: RunContext, book: RunBook, points: SafePoints) -> None:
        self.ctx = ctx
        self.book = book
        self.points = points

    def evaluate_point(self, cycle: int, phase: str, key: str) -> bool:
        """An evaluation of the current weights and accepted harness: val, and test where
        `eval.test_every` asks for it (skipped when neither changed since the last point).
        False when a stop interrupted it."""
        book = self.book
        if self._weight_eval_is_current():
            book.state.last_eval = book.identity()
        if book.state.last_eval == book.identity():
            self.ctx.emit(
                Log(
                    level="info",
                    message=f"{phase} evaluation skipped: weights and harness are those of the "
                    "last evaluation point",
                )
            )
            return True
        r = book.rsft
        if phase == "weight" and r is not None and not (r.evals and r.evals[-1].step == r.step):
            # a weight-phase checkpoint (the weight phase keys its checkpoints by step)
            r.harness_rollouts = book.harness_rollouts()
            if r.evaluate(book.harness_path, should_stop=self.points.eval_should_stop) is None:
                return False
            book.state.last_eval = book.identity()
            book.save()
            return True
        return self._engine_evaluation(cycle, phase, key)

    def _engine_evaluation(self, cycle: int, phase: str, key: str) -> bool:
        ctx, book = self.ctx, self.book
        cfg = ctx.cfg
        harness = book.harness_path
        k = cfg.sampling.k
        evaluator = ctx.evaluator
        floor = None if cfg.eval.test_every == "always" else self._best_val_so_far()
        splits = [
            (split, list(ctx.domain.tasks(split)), val_params(cfg, idx))  # type: ignore[arg-type]
            for idx, split in enumerate(("val", "test"))
        ]
        host = evaluator.host(harness)
        try:
            info = {"cycle": cycle, "engine_eval": True}
            reports = evaluator.score_splits(
                harness,
                splits,
                k,
                sink=lambda split: ctx.sink(
                    f"eval-{split}", phase="eval", harness=host.info.name, info=info
                ),
                # a tie on val is scored on test too: the paired tie-break may choose it
                wanted=lambda split, done: (
                    split == "val" or floor is None or reaches_best(done["val"].mean_at_k, floor)
                ),
                should_stop=self.points.eval_should_stop,
                host=host,
            )
        finally:
            host.close()
        sizes = {split: len(tasks) * k for split, tasks, _ in splits}
        if any(rep.rollouts < sizes[split] for split, rep in reports.items()):
            return False
        folder = book.root / "checkpoints" / key
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(harness, folder / "harness.py")
        weights = self._weights_ref(folder)
        val, test = reports["val"], reports.get("test")
        meta = {
            "key": key,
            "cycle": cycle,
            "phase": phase,
            "harness": book.state.harness,
            "weights": weights,
            "val_mean_at_k": val.mean_at_k,
            "test_mean_at_k": test.mean_at_k if test is not None else None,
            "k": k,
            "weight_rollouts": book.weight_rollouts(),
            "harness_rollouts": book.harness_rollouts(),
            "ts": time.time(),
        }
        atomic_write_json(folder / "checkpoint.json", meta)
        book.state.eval_rollouts = int(book.state.eval_rollouts) + sum(
            rep.rollouts for rep in reports.values()
        )
        book.state.checkpoints[book.rel(folder)] = meta
        for split, rep in reports.items():
            ctx.emit(
                EvalResult(
                    split=split,
                    cycle=cycle,
                    phase=phase,
                    mean_at_k=rep.mean_at_k,
                    pass_at_k=rep.pass_at_k,
                    k=k,
                    n_tasks=rep.n_tasks,
                    harness=host.info.name,
                    checkpoint=str(folder),
                    weight_rollouts=book.weight_rollouts(),
                    harness_rollouts=book.harness_rollouts(),
                    diagnostics={
                        kk: float(v)
                        for kk, v in rep.diagnostics.items()
                        if isinstance(v, (int, float)) and math.isfinite(float(v))
                    },
                )
            )
        book.state.last_eval = book.identity()
        book.save()
        return True

    def _best_val_so_far(self) -> float | None:
        """The run's best val mean@k before this point: the engine's own points (their
        checkpoints) and the weight phase's evaluations."""
        vals = [
            float(meta["val_mean_at_k"])
            for meta in self.book.state.checkpoints.values()
            if isinstance(meta, dict) and isinstance(meta.get("val_mean_at_k"), (int, float))
        ]
        r = self.book.rsft
        if r is not None:
            vals += [float(e.val) for e in r.evals]
        return max(vals, default=None)

    def _weight_eval_is_current(self) -> bool:
        """Whether the weight phase's newest evaluation measured the weights and harness in force
        now. The engine marks a weight-phase point as evaluated when its test result arrives;
        a point that scored val alone (not a new best) sends none, so it is recognised here."""
        r = self.book.rsft
        if r is None or not r.evals or r.evals[-1].step != r.step or self._kept_since_eval():
            return False
        return file_sha(r.evals[-1].harness) == file_sha(self.book.harness_path)

    def _weights_ref(self, folder: Path) -> str:
        """Where the weights of an evaluation point can be found (saved now if nowhere)."""
        book = self.book
        r = book.rsft
        if r is None or (r.updates == 0 and not book.state.kept_weights):
            return f"base:{self.ctx.cfg.model.path}"
        ident = book.weights_identity()
        ref = book.state.weights_ref
        if isinstance(ref, dict) and ref.get("identity") == ident:
            return str(ref["path"])
        if r.evals and r.evals[-1].step == r.step and not self._kept_since_eval():
            return book.rel(r.evals[-1].checkpoint)
        path = folder / "weights"
        r.tm.save_pretrained(path)
        book.state.weights_ref = {"identity": ident, "path": book.rel(path)}
        return book.rel(path)

    def _kept_since_eval(self) -> bool:
        """Whether probe weights were kept after the weight phase's last evaluation."""
        r = self.book.rsft
        last = self.book.state.kept_weights_at
        return bool(
            last
            and r is not None
            and r.evals
            and int(last["evals"]) == len(r.evals)
            and int(last["step"]) == r.step
        )
