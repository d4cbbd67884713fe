"""The phase runners: drive one weight or harness phase of the plan to its end, resumably.

A phase is entered once (its `PhaseRecord` is made and persisted), runs until its budget, its
adaptive rule, a switch or a stop, and is closed in two persisted steps ("ending", then "ended")
so a process killed in between neither loses nor repeats the phase's end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from whale_lab.context import RunContext
from whale_lab.engine.runbook import RunBook
from whale_lab.engine.safepoints import SafePoints
from whale_lab.engine.schedules import (
    AdaptiveHarnessStop,
    AdaptiveWeightStop,
    PhaseSpec,
    adaptive_weight_steps,
)
from whale_lab.engine.state import PhaseRecord
from whale_lab.events import CommandApplied, Log, PhaseEnded, PhaseStarted, WeightStep
from whale_lab.seams import Reviewer
from whale_lab.store import RunStore


class PhaseRunner:
    """Runs the plan's phases over one run context; outcome "ended", "stopped" or "pending"."""

    def __init__(
        self,
        ctx: RunContext,
        book: RunBook,
        points: SafePoints,
        *,
        reviewer: Reviewer,
        gate: Any,
    ) -> None:
        self.ctx = ctx
        self.book = book
        self.points = points
        self.reviewer = reviewer
        self.gate = gate
        self.cycle = 0
        self.kind = ""
        self.reopened = False  # the phase was closing ("ending") when the last process ended

    def _log(self, message: str, level: str = "info") -> None:
        self.ctx.emit(Log(level=level, message=message))

    # ------------------------------------------------------------------ the weight phase object
    def weights(self) -> Any:
        """The run's weight phase object (created once; resumed from its last resume point)."""
        book = self.book
        if book.rsft is None:
            from whale_lab.weights.rsft import RsftPhase

            r = RsftPhase(self.ctx, cycle=self.cycle)
            if r.resume() and r.mode == "adapter" and r.updates > 0:
                # a server starts on the base model: serve the resumed adapter before anything
                # (a harness phase resumed next must score under these weights)
                r.publish(initial=True)
            book.rsft = r
        return book.rsft

    # ------------------------------------------------------------------ common
    def open(self, i: int, spec: PhaseSpec) -> PhaseRecord:
        """The phase's record (made on first entry); PhaseStarted for a phase that runs now."""
        book, state = self.book, self.book.state
        try:
            rec = state.record(i)
        except KeyError:
            rec = PhaseRecord(
                index=i,
                kind=spec.kind,
                cycle=spec.cycle,
                budget=spec.budget,
                adaptive=spec.adaptive,
                status="running",
                reason="",
                started=time.time(),
                incoming=state.harness,
                start_weight_rollouts=book.weight_rollouts(),
            )
            if spec.kind == "weight":
                rec.start_step = int(self.weights().step)
            else:
                name = f"cycle-{spec.cycle:02d}"
                used = {r.dir for r in state.phases}
                folder = f"harness_phases/{name}"
                if folder in used:
                    folder = f"harness_phases/{name}-p{i:02d}"
                rec.dir = folder
            state.phases.append(rec)
            book.save()
        self.cycle, self.kind = spec.cycle, spec.kind
        self.reopened = rec.status == "ending"
        if rec.status == "running":
            steps = 0
            if spec.kind == "weight":
                steps = int(self.weights().steps_for(self._weight_budget(i, spec, self.weights())))
            self.ctx.emit(
                PhaseStarted(
                    cycle=spec.cycle,
                    phase=spec.kind,
                    budget=float(spec.budget),
                    budget_unit=spec.unit,
                    harness=str(rec.incoming),
                    steps=steps,
                    start_step=int(rec.start_step or 0) if spec.kind == "weight" else 0,
                )
            )
        return rec

    def _record_switch(self, rec: PhaseRecord) -> None:
        cmd = self.points.take_switch()
        entry = {
            "phase_index": rec.index,
            "phase": rec.kind,
            "cycle": rec.cycle,
            "by": cmd.by if cmd else "",
            "reason": cmd.reason if cmd else "",
            "ts": time.time(),
        }
        rec.switch = entry
        self.book.state.switches.append(entry)
        why = f": {entry['reason']}" if entry["reason"] else ""
        self._log(f"cycle {rec.cycle} {rec.kind} phase ended by a switch from {entry['by']}{why}")
        self.ctx.emit(
            CommandApplied(command="switch", detail=f"cycle {rec.cycle} {rec.kind} phase ended")
        )

    def _ended(self, spec: PhaseSpec, rec: PhaseRecord) -> None:
        if not (self.reopened and self._end_logged(spec)):
            self.ctx.emit(
                PhaseEnded(
                    cycle=spec.cycle,
                    phase=spec.kind,
                    reason=rec.reason,
                    weight_rollouts=self.book.weight_rollouts(),
                    harness_rollouts=self.book.harness_rollouts(),
                )
            )
        rec.status = "ended"
        self.book.save()

    def _end_logged(self, spec: PhaseSpec) -> bool:
        """Whether this phase's PhaseEnded is already in the log: a process killed between
        writing it and recording "ended" must not write it again on resume. The phase's events
        are its log's last PhaseStarted/PhaseEnded of that cycle and kind (phases run in order)."""
        last = ""
        for ev in RunStore.read_events(self.ctx.store.root):
            if isinstance(ev, (PhaseStarted, PhaseEnded)) and (ev.cycle, ev.phase) == (
                spec.cycle,
                spec.kind,
            ):
                last = ev.type
        return last == PhaseEnded.type

    # ------------------------------------------------------------------ weights
    def _weight_rule(self, rsft: Any) -> Callable[[Sequence[WeightStep]], bool]:
        """The adaptive rule replayed over the phase's steps (so a resumed phase sees them all)."""
        steps_per_epoch = len(rsft.weight_tasks) / self.ctx.cfg.rsft.prompts_per_step
        schedule = self.ctx.cfg.schedule

        def stop_when(history: Sequence[WeightStep]) -> bool:
            rule = AdaptiveWeightStop(steps_per_epoch, schedule)  # type: ignore[arg-type]
            fire = False
            for step in history:
                fire = rule.update(step.train_reward)
            return fire

        return stop_when

    def _weight_budget(self, i: int, spec: PhaseSpec, rsft: Any) -> float:
        """An adaptive phase gets at most what earlier weight phases left of the total budget."""
        if not spec.adaptive:
            return spec.budget
        steps_per_epoch = len(rsft.weight_tasks) / self.ctx.cfg.rsft.prompts_per_step
        used_steps = sum(
            int(rec.end_step) - int(rec.start_step or 0)
            for rec in self.book.state.phases
            if rec.kind == "weight" and rec.index != i and rec.end_step is not None
        )
        schedule = self.ctx.cfg.schedule
        steps = adaptive_weight_steps(
            schedule.total_weight_epochs,
            steps_per_epoch,
            used_steps,
            schedule.max_phase_weight_epochs,
        )
        return steps / steps_per_epoch

    def weight_phase(self, i: int, spec: PhaseSpec) -> str:
        rsft = self.weights()
        rec = self.open(i, spec)
        points = self.points
        if rec.status == "running":
            reason = ""
            if not rsft.phase_active and rsft.step > int(rec.start_step or 0):
                # the phase finished before the last process ended, and was not recorded
                done = rsft.step - int(rec.start_step or 0)
                short = spec.adaptive and done < rsft.steps_for(self._weight_budget(i, spec, rsft))
                reason = "patience" if short else "budget"
            if (
                not reason
                and spec.adaptive
                and not rsft.phase_active
                and self._weight_budget(i, spec, rsft) <= 0
            ):
                reason = "budget"  # the shared total is spent: this phase takes no step
            rule = self._weight_rule(rsft) if spec.adaptive else None
            points.phase_active = True
            try:
                while not reason:
                    points.begin_attempt()
                    rsft.harness_rollouts = self.book.harness_rollouts()
                    result = rsft.run(
                        self.book.harness_path,
                        epochs=self._weight_budget(i, spec, rsft),
                        stop_when=rule,
                        should_stop=points.interrupt_phase,
                        cycle=spec.cycle,
                        final_eval=True,
                    )
                    if result.reason != "stop":
                        reason = "patience" if result.reason == "stop_when" else "budget"
                        break
                    action = points.after_interrupt()
                    if action == "stop":
                        return "stopped"
                    if action == "switch":
                        self._record_switch(rec)
                        reason = "switch"
            finally:
                points.phase_active = False
                points.interrupt = ""
            rec.status, rec.reason = "ending", reason
            self.book.save()
        if rec.status == "ending":
            if rsft.phase_active:
                rsft.end_phase()
            rec.end_step = int(rsft.step)
            rec.end_weight_rollouts = int(rsft.rollouts)
            self._ended(spec, rec)
        return "ended"

    # ------------------------------------------------------------------ harness
    def _harness_rule(self) -> Callable[[Any], bool]:
        schedule = self.ctx.cfg.schedule

        def stop_when(status: Any) -> bool:
            rule = AdaptiveHarnessStop(schedule)
            fire = False
            for best in status.history:
                fire = rule.update(best)
            return fire

        return stop_when

    def harness_phase(self, i: int, spec: PhaseSpec) -> str:
        from whale_lab.search.meta_harness import HarnessPhase

        book, points = self.book, self.points
        rec = self.open(i, spec)
        if rec.status == "running":
            proposer = None  # the configured one
            if spec.draws:
                from whale_lab.search.proposers.rules.draw import DrawProposer

                proposer = DrawProposer(seed=self.ctx.cfg.run.seed)
            hp = HarnessPhase(
                self.ctx,
                self.reviewer,
                cycle=spec.cycle,
                proposer=proposer,
                phase_dir=book.abs(rec.dir or ""),
                gate=self.gate,
            )
            book.hp, book.hp_index = hp, i
            rule = self._harness_rule() if spec.adaptive else None
            reason, accepted = "", ""
            points.phase_active = True
            try:
                while not reason:
                    points.begin_attempt()
                    result = hp.run(
                        book.abs(rec.incoming),
                        iterations=int(round(spec.budget)),
                        stop_when=rule,
                        should_stop=points.interrupt_phase,
                    )
                    if result.status == "completed":
                        reason, accepted = result.reason, result.accepted_path
                        break
                    if result.status == "pending":
                        points.poll()
                        rec.pending = list(result.pending)
                        book.save()
                        return "stopped" if points.stop_requested() else "pending"
                    action = points.after_interrupt()
                    if action == "stop":
                        return "stopped"
                    if action == "switch":
                        self._record_switch(rec)
                        reason, accepted = "switch", result.accepted_path
            finally:
                points.phase_active = False
                points.interrupt = ""
                book.save()
                book.hp, book.hp_index = None, -1
            rec.status, rec.reason, rec.pending = "ending", reason, []
            rec.accepted = book.rel(accepted) if accepted else rec.incoming
            book.save()
        if rec.status == "ending":
            book.state.harness = str(rec.accepted)
            self._ended(spec, rec)
        return "ended"
