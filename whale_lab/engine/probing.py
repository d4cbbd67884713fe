"""Running a bottleneck probe inside a run, and adopting what the user asked to keep from it.

A probe (`engine/probe.py`) measures both levers from the current point; by default it changes
nothing. Keeping its harness or its weights is an explicit choice, recorded in the run's state and
counted in the ledger, so a kept probe result never passes as the schedule's own progress.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale_lab.context import RunContext
from whale_lab.engine.ledger import ProbeLedger
from whale_lab.engine.probe import BottleneckProbe, ProbeSettings, ProbeStopped
from whale_lab.engine.runbook import RunBook
from whale_lab.engine.safepoints import SafePoints
from whale_lab.events import Log, ProbeResult


class ProbeRunner:
    """Runs the pending probe request of `points`, with the run's weights and harness."""

    def __init__(
        self,
        ctx: RunContext,
        book: RunBook,
        points: SafePoints,
        settings: ProbeSettings,
        *,
        weights: Callable[[], Any],
        cycle: Callable[[], int],
    ) -> None:
        self.ctx = ctx
        self.book = book
        self.points = points
        self.settings = settings
        self.weights = weights
        self.cycle = cycle

    def _log(self, message: str, level: str = "info") -> None:
        self.ctx.emit(Log(level=level, message=message))

    def run(self) -> None:
        points, book = self.points, self.book
        cmd = points.probe_request
        assert cmd is not None
        settings = ProbeSettings.from_args(cmd.args, self.settings)
        before = points.state_name
        points.in_probe = True
        points.set("probing")
        index = self.next_index()
        probe = BottleneckProbe(
            self.ctx,
            index=index,
            harness_path=book.harness_path,
            run_weights=book.rsft,
            settings=settings,
            cycle=self.cycle(),
            should_stop=points.probe_should_stop,
        )
        try:
            report = probe.run()
        except ProbeStopped:
            self._log(
                f"probe {index} abandoned (stop requested); weights and harness are as they were"
            )
            return
        except Exception as exc:  # noqa: BLE001 - a failed probe must not end the run
            self._log(f"probe {index} failed: {type(exc).__name__}: {exc}", "error")
            self.ctx.emit(
                ProbeResult(
                    harness_gain_per_1k=0.0,
                    weight_gain_per_1k=0.0,
                    recommendation=f"The probe failed: {exc}",
                    evidence=(f"{type(exc).__name__}: {exc}",),
                )
            )
            return
        finally:
            points.probe_request = None
            points.in_probe = False
            points.set(before if before != "probing" else "running")
        self._record(index, cmd, report)

    def _record(self, index: int, cmd: Any, report: Any) -> None:
        book, state = self.book, self.book.state
        kept = self._apply_keep(report)
        usage = dict(report.harness.usage)
        totals = state.probe_usage
        for key in ("prompt_tokens", "completion_tokens", "cost", "seconds"):
            totals[key] = totals.get(key, 0) + usage.get(key, 0)
        kept_rollouts = (report.weights.rollouts if "weights" in kept else 0) + (
            report.harness.rollouts if "harness" in kept else 0
        )
        entry = ProbeLedger(
            index=index,
            rollouts=report.rollouts,
            weight_rollouts=report.weights.rollouts,
            harness_rollouts=report.harness.rollouts,
            eval_rollouts=report.eval_rollouts,
            proposer_prompt_tokens=int(usage.get("prompt_tokens", 0)),
            proposer_completion_tokens=int(usage.get("completion_tokens", 0)),
            proposer_cost=float(usage.get("cost", 0.0)),
            kept=tuple(kept),
        )
        state.probes.append(
            {
                **dataclasses.asdict(entry),
                "kept": list(kept),
                "folder": book.rel(report.folder),
                "recommendation": report.recommendation.text,
                "side": report.recommendation.side,
                "by": cmd.by,
                "reason": cmd.reason,
            }
        )
        state.probe_rollouts = int(state.probe_rollouts) + report.rollouts
        state.kept_probe_rollouts = int(state.kept_probe_rollouts) + kept_rollouts
        book.save()
        self.ctx.emit(report.event())

    def next_index(self) -> int:
        """A fresh probe folder, also past any probe a killed process left half done."""
        used = [len(self.book.state.probes)]
        for p in (self.book.root / "probes").glob("probe-*"):
            tail = p.name.split("-", 1)[1]
            if tail.isdigit():
                used.append(int(tail))
        return max(used) + 1

    def _apply_keep(self, report: Any) -> list[str]:
        """Adopt what the user asked to keep from a probe; returns the sides kept."""
        book, state = self.book, self.book.state
        kept: list[str] = []
        if "harness" in report.kept:
            if book.hp is not None:
                self._log(
                    f"probe {report.index}: the harness result is not kept during a "
                    "harness phase (pin a candidate instead)",
                    "warning",
                )
            else:
                dst = book.root / "harnesses" / f"probe-{report.index:03d}.py"
                shutil.copyfile(report.harness.artifact, dst)
                state.harness = book.rel(dst)
                state.kept_harness_rollouts = (
                    int(state.kept_harness_rollouts) + report.harness.rollouts
                )
                kept.append("harness")
                self._log(f"probe {report.index}: kept its harness as {book.rel(dst)}")
        if "weights" in report.kept and report.weight_phase is not None:
            self._adopt_weights(report)
            kept.append("weights")
            self._log(f"probe {report.index}: kept its weights")
        book.save()
        return kept

    def _adopt_weights(self, report: Any) -> None:
        import torch

        book, state = self.book, self.book.state
        probe_phase = report.weight_phase
        run = self.weights()
        if run.tm is not probe_phase.tm:
            live = dict(run.tm.named_trainable())
            with torch.no_grad():
                for n, p in probe_phase.tm.named_trainable():
                    live[n].copy_(p.detach())
        run.optimizer.load_state_dict(copy.deepcopy(probe_phase.optimizer.state_dict()))
        run.sampler.load_state_dict(probe_phase.sampler.state_dict())
        run.rollouts += int(probe_phase.rollouts)
        run.updates = max(int(run.updates), int(probe_phase.updates))
        run.save_resume_point()
        state.kept_weights = int(state.kept_weights) + 1
        state.kept_weights_at = {"step": int(run.step), "evals": len(run.evals)}
        folder = Path(report.folder) / "kept_weights"
        run.tm.save_pretrained(folder)
        state.weights_ref = {"identity": book.weights_identity(), "path": book.rel(folder)}
