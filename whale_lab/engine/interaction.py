"""The interaction probe: does the harness search's gain depend on the weight update?

The paper's "the harness helps math only after a weight update" is a 2 x 2 claim. On a finished
(or stopped) run, this probe scores {the last harness phase's incumbent, its best candidate} x
{the weights at the start of the last weight phase, at its end} on the val tasks with the run's
val seeds, so every cell shares tasks and sampling streams (the two harnesses under one set of
weights run interleaved, in the same generation calls), and reports each cell, the harness
gain under each weights, and the interaction (gain after minus gain before) with a paired
bootstrap interval over tasks. An interval that includes zero is "inconclusive", with the number
of val tasks that would resolve an interaction of the observed size.

The weights come from the weight phase's evaluation checkpoints (`weights/checkpoints/step-N`;
step 0 is the base model, a zero LoRA update). They are loaded into the run's trainable model
for the scoring and the run's own weights are put back afterwards; nothing the run selected or
accepted changes. The result lands in `<run>/probes/interaction-NNN/interaction.json` and, as an
`InteractionResult` event, in the run's log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.context import Arm, RunContext
from whale_lab.engine.errors import EngineError
from whale_lab.engine.probe import STEP_OFFSET, val_params
from whale_lab.engine.runbook import RunBook
from whale_lab.events import InteractionResult, Log
from whale_lab.paired import METHOD, InteractionEffect, interaction_effect, scores_by_task
from whale_lab.store import atomic_write_json

BASE = "base"  # the weights reference of step 0: the base model


class InteractionError(EngineError):
    """The run cannot be probed this way (no finished weight or harness phase, no checkpoint)."""


class InteractionStopped(RuntimeError):
    """A stop request arrived mid-probe; the run's weights were restored, nothing recorded."""


@dataclass(frozen=True)
class InteractionPlan:
    """What the probe compares, read from the run's phases."""

    incumbent: Path
    candidate: Path
    candidate_note: str
    harness_cycle: int
    weight_cycle: int
    before: str  # BASE or a checkpoint folder
    after: str
    before_step: int
    after_step: int


def _best_candidate(book: RunBook, rec: Any) -> tuple[Path, str]:
    """The harness phase's accepted candidate when it is not the incumbent, else its best-scoring
    candidate on the harness split (what search found, accepted or not)."""
    from whale_lab.search.archive import INCOMING, SCORED_STATUSES, PhaseArchive

    incumbent = book.abs(rec.incoming)
    accepted = book.abs(rec.accepted) if rec.accepted else None
    if accepted is not None and accepted.is_file() and not _same(accepted, incumbent):
        return accepted, f"the candidate accepted in cycle {rec.cycle} ({book.rel(accepted)})"
    archive = PhaseArchive(book.abs(rec.dir or ""))
    scored = [
        r
        for r in archive.records()
        if r.proposer != INCOMING and r.status in SCORED_STATUSES and r.success_rate is not None
    ]
    scored = [r for r in scored if not _same(r.harness_path, incumbent)]
    if not scored:
        raise InteractionError(
            f"interaction probe: the cycle {rec.cycle} harness phase scored no candidate other "
            "than its incumbent, so there is no harness gain to measure"
        )
    best = max(
        scored, key=lambda r: (r.success_rate or 0.0, -(r.mean_turns or 0.0), -int(r.id[1:]))
    )
    return best.harness_path, (
        f"the best-scoring candidate of cycle {rec.cycle}, {best.id} "
        f"({best.success_rate:.1%} on the harness split; the incumbent was kept)"
    )


def _same(a: Path, b: Path) -> bool:
    try:
        return a.read_bytes() == b.read_bytes()
    except OSError:
        return False


def plan_interaction(book: RunBook) -> InteractionPlan:
    """The last ended harness phase's pair and the last ended weight phase's two ends."""
    from whale_lab.weights.checkpoint import step_name

    ended = [r for r in book.state.phases if r.status == "ended"]
    weights = [r for r in ended if r.kind == "weight" and r.end_step is not None]
    harness = [r for r in ended if r.kind == "harness"]
    if not weights or not harness:
        raise InteractionError(
            "interaction probe: the run needs an ended weight phase and an ended harness phase "
            f"(it has {len(weights)} and {len(harness)}); run a schedule with both, e.g. whale"
        )
    w, h = weights[-1], harness[-1]
    start, end = int(w.start_step or 0), int(w.end_step)
    if end <= start:
        raise InteractionError(
            f"interaction probe: the cycle {w.cycle} weight phase made no step ({start} -> {end})"
        )

    def ref(step: int) -> str:
        if step == 0:
            return BASE
        folder = book.root / "weights" / "checkpoints" / step_name(step)
        if not folder.is_dir():
            raise InteractionError(
                f"interaction probe: no saved weights at step {step} "
                f"({book.rel(folder)}); the probe reads the weight phase's evaluation checkpoints"
            )
        return str(folder)

    candidate, note = _best_candidate(book, h)
    return InteractionPlan(
        incumbent=book.abs(h.incoming),
        candidate=candidate,
        candidate_note=note,
        harness_cycle=int(h.cycle),
        weight_cycle=int(w.cycle),
        before=ref(start),
        after=ref(end),
        before_step=start,
        after_step=end,
    )


def verdict_of(result: InteractionEffect) -> str:
    """ "positive" (the harness gains more after the weight update), "negative", "inconclusive"."""
    return {"better": "positive", "worse": "negative"}.get(
        result.interaction.verdict(), "inconclusive"
    )


def describe(result: InteractionEffect, plan: InteractionPlan | None = None) -> str:
    """The probe's finding in plain words: only what the interval supports."""
    i = result.interaction
    g0, g1 = result.gain_0, result.gain_1

    def gain(r: Any) -> str:
        return f"{r.diff:+.3f} [{r.low:+.3f}, {r.high:+.3f}]"

    where = (
        f" (weights at step {plan.before_step} vs {plan.after_step}, cycle {plan.weight_cycle})"
        if plan
        else ""
    )
    text = (
        f"Harness gain (candidate minus incumbent, val mean@k) before the weight phase "
        f"{gain(g0)}, after it {gain(g1)}{where}; interaction (after minus before) "
        f"{gain(i)} on {result.n_tasks} val tasks (95% {METHOD})."
    )
    v = verdict_of(result)
    if v == "positive":
        return text + " The harness candidate helps more after the weight update."
    if v == "negative":
        return text + " The harness candidate helps less after the weight update."
    need = i.needed_tasks()
    if need:
        size = f"; about {need} val tasks would resolve an interaction of {abs(i.diff):.3f}"
    elif i.n_tasks and i.sd == 0.0:
        size = (
            f"; the candidate's gain was the same under both weights on all {i.n_tasks} tasks, "
            "so there is no spread to size a larger test from"
        )
    else:
        size = ""

    return text + f" Inconclusive: no interaction detected at this size{size}."


class InteractionProbe:
    """Scores the four cells on the run's context; the run's weights are restored afterwards."""

    def __init__(
        self,
        ctx: RunContext,
        book: RunBook,
        weights: Any,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.ctx = ctx
        self.book = book
        self.weights = weights  # the run's RsftPhase (resumed at its latest point)
        self.should_stop = should_stop or (lambda: False)
        self.k = ctx.cfg.sampling.k
        self.rollouts = 0

    def _index(self) -> int:
        used = [0]
        for p in (self.book.root / "probes").glob("interaction-*"):
            tail = p.name.split("-", 1)[1]
            if tail.isdigit():
                used.append(int(tail))
        return max(used) + 1

    def _score(
        self, cells: list[tuple[Path, str]], name: str
    ) -> list[dict[str, list[float | None]]]:
        """The cells (harness, label) under the weights now served, as interleaved arms: every
        turn is one generation over both harnesses' episodes, so drift lands on both."""
        from whale_lab.harness.host import harness_name

        tasks = list(self.ctx.domain.tasks("val"))
        params = val_params(self.ctx.cfg, 0)
        arms = [
            Arm(
                harness,
                params,
                self.ctx.sink(
                    name, phase="probe", harness=harness_name(harness), info={"interaction": label}
                ),
            )
            for harness, label in cells
        ]
        reports = self.ctx.evaluator.score_arms(arms, tasks, self.k, should_stop=self.should_stop)
        self.rollouts += sum(r.rollouts for r in reports)
        if any(r.rollouts < len(tasks) * self.k for r in reports):
            raise InteractionStopped("stop requested during the interaction probe")
        return [scores_by_task(r.traces) for r in reports]

    def _load(self, ref: str, step: int) -> None:
        """Put the weights of `ref` into the trainable model (and serve them)."""
        import torch

        from whale_lab.weights.lora import load_adapter_weights

        r = self.weights
        tm = r.tm
        if not tm.lora:
            raise InteractionError(
                "interaction probe: it swaps LoRA adapters; with rsft.full_finetune the run "
                "keeps no loadable weights per step"
            )
        if ref == BASE:
            with torch.no_grad():
                for n, p in tm.named_trainable():
                    if "lora_B" in n:
                        p.zero_()  # a zero update: exactly the base model
        else:
            load_adapter_weights(tm, ref)
        if r.mode != "in_place":
            saved_step = r.step
            r.step = STEP_OFFSET + step
            try:
                r.publish()
            finally:
                r.step = saved_step

    def run(self) -> dict[str, Any]:
        import torch

        plan = plan_interaction(self.book)
        index = self._index()
        folder = self.book.root / "probes" / f"interaction-{index:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        emit = self.ctx.emit
        emit(
            Log(
                level="info",
                message=(
                    f"interaction probe {index}: {plan.incumbent.name} and {plan.candidate_note} "
                    f"x the weights at step {plan.before_step} and {plan.after_step}, on val"
                ),
            )
        )
        t0 = time.perf_counter()
        tm = self.weights.tm
        saved = {n: p.detach().clone() for n, p in tm.named_trainable()}
        adapters_before = set(getattr(self.ctx.backend, "adapters", {}) or {})
        active_before = getattr(self.ctx.backend, "active_model", None)
        trace = f"interaction-{index:03d}-val"
        scores: dict[str, dict[str, list[float | None]]] = {}
        try:
            for when, ref, step in (
                ("before", plan.before, plan.before_step),
                ("after", plan.after, plan.after_step),
            ):
                self._load(ref, step)
                cells = [("incumbent", plan.incumbent), ("candidate", plan.candidate)]
                got = self._score([(path, f"{arm} x {when}") for arm, path in cells], trace)
                for (arm, _), cell in zip(cells, got, strict=True):
                    scores[f"{arm}/{when}"] = cell
        finally:
            with torch.no_grad():
                for n, p in tm.named_trainable():
                    p.copy_(saved[n])
            self._restore_served(adapters_before, active_before)
        result = interaction_effect(
            scores["incumbent/before"],
            scores["candidate/before"],
            scores["incumbent/after"],
            scores["candidate/after"],
            seed=index,
        )
        text = describe(result, plan)
        out = {
            "index": index,
            "folder": self.book.rel(folder),
            "verdict": verdict_of(result),
            "text": text,
            "method": METHOD,
            "level": result.interaction.level,
            "k": self.k,
            "rollouts": self.rollouts,
            "seconds": round(time.perf_counter() - t0, 3),
            "incumbent": self.book.rel(plan.incumbent),
            "candidate": self.book.rel(plan.candidate),
            "candidate_note": plan.candidate_note,
            "harness_cycle": plan.harness_cycle,
            "weight_cycle": plan.weight_cycle,
            "weights_before": self.book.rel(plan.before) if plan.before != BASE else BASE,
            "weights_after": self.book.rel(plan.after) if plan.after != BASE else BASE,
            "steps": [plan.before_step, plan.after_step],
            "cells": {
                "incumbent/before": result.cells["a0"],
                "candidate/before": result.cells["b0"],
                "incumbent/after": result.cells["a1"],
                "candidate/after": result.cells["b1"],
            },
            **{k: v for k, v in result.to_dict().items() if k != "cells"},
        }
        out["needed_tasks"] = result.interaction.needed_tasks()
        atomic_write_json(folder / "interaction.json", out)
        emit(self.event(out))
        return out

    @staticmethod
    def event(out: dict[str, Any]) -> InteractionResult:
        return InteractionResult(
            verdict=out["verdict"],
            text=out["text"],
            cells=dict(out["cells"]),
            gain_before=out["gain_before"],
            gain_after=out["gain_after"],
            interaction=out["interaction"],
            incumbent=out["incumbent"],
            candidate=out["candidate"],
            steps=tuple(out["steps"]),
            rollouts=int(out["rollouts"]),
        )

    def _restore_served(self, adapters_before: set[str], active_before: Any) -> None:
        """Adapter backends: drop the adapters this probe loaded and serve the run's again."""
        backend = self.ctx.backend
        adapters = getattr(backend, "adapters", None)
        if isinstance(adapters, dict):
            for name in sorted(set(adapters) - adapters_before):
                try:
                    backend.unload_adapter(name)
                except Exception as exc:  # noqa: BLE001 - a leftover adapter is harmless
                    self.ctx.emit(Log(level="warning", message=f"could not unload {name}: {exc}"))
        if hasattr(backend, "active_model"):
            backend.active_model = active_before


def run_interaction(engine: Any, should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """The interaction probe on an opened engine's run (holding the run's lock meanwhile)."""
    from whale_lab.engine import runlock

    runlock.acquire(engine.root)
    try:
        plan_interaction(engine.book)  # fail on an unsuitable run before loading the model
        weights = engine.phases.weights()
        return InteractionProbe(engine.ctx, engine.book, weights, should_stop).run()
    finally:
        runlock.release(engine.root)


__all__ = [
    "InteractionError",
    "InteractionPlan",
    "InteractionProbe",
    "InteractionStopped",
    "describe",
    "plan_interaction",
    "run_interaction",
    "verdict_of",
]
