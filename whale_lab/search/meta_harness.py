"""The harness phase: Meta-Harness search under the current weights, resumable from its archive.

Iteration 1 re-scores the incoming harness under the current weights (twice with paired
acceptance, both scorings interleaved in the same generation calls: the second, with other
sampling seeds, measures the split's noise floor). Every later iteration asks the
proposer for M candidates (having read the archive), validates them, puts them through the
approval gate, and scores the approved ones on the `harness` split. At the end the best candidate
is accepted when its paired interval against the incoming harness clears `min_gain` (or, with
`acceptance = "best"`, the best success rate wins), unless a human pinned another. Every step is
written to the archive before the next begins, so a killed phase resumes where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from whale_lab.backends.base import Backend, BackendError
from whale_lab.config import Config
from whale_lab.context import Arm, EpisodeSink, RunContext
from whale_lab.domains.base import Domain, Task
from whale_lab.errors import WhaleLabError
from whale_lab.events import (
    CandidateProposed,
    CandidateValidated,
    Event,
    HarnessAccepted,
    Log,
    PhaseProgress,
    ProposerUsage,
    ReviewDecided,
    ReviewRequested,
)
from whale_lab.seams import ReviewDecision, Reviewer, ReviewItem
from whale_lab.search.acceptance import (
    REPEAT_SALT,
    _mix,
    last_acceptance_is,
    measure_noise_floor,
    noise_floor_record,
    paired_acceptance_note,
)
from whale_lab.search.approval import ApprovalGate
from whale_lab.search.archive import (
    INCOMING,
    SCORED_STATUSES,
    TERMINAL_STATUSES,
    ArchiveError,
    PhaseArchive,
)
from whale_lab.search.candidate_hosts import CandidateHosts
from whale_lab.search.phase_types import PhaseResult, PhaseStatus
from whale_lab.search.proposers.base import ProposalRequest, ProposalSession, Proposer
from whale_lab.search.scoring import record_crash, set_scored_status, transcript_of, write_scores
from whale_lab.search.steering import steered
from whale_lab.search.surfaces import changed_surfaces
from whale_lab.search.validate import ValidationOutcome, validate_candidate
from whale_lab.store import JsonlWriter, RunStore, atomic_write_json, read_json

ONE_ITERATION_NOTE = (
    "the harness phase budget is 1 iteration: it only re-scores the incoming harness and never "
    "calls the proposer (give it 2 or more iterations)"
)


class HarnessPhaseError(WhaleLabError, RuntimeError):
    """The phase cannot run (e.g. the incoming harness is not a valid harness)."""


def _no() -> bool:
    return False


class _Stopped(Exception):
    pass


class _Pending(Exception):
    def __init__(self, cid: str) -> None:
        super().__init__(cid)
        self.cid = cid


class HarnessPhase:
    """One harness phase of one cycle; its archive is `<run>/harness_phases/cycle-NN/`."""

    def __init__(
        self,
        ctx: RunContext,
        reviewer: Reviewer | None,
        *,
        cycle: int = 1,
        proposer: Proposer | None = None,
        phase_dir: str | Path | None = None,
        gate: ApprovalGate | None = None,
        prompt_only: bool | None = None,
    ) -> None:
        self.ctx = ctx
        cfg, store = ctx.cfg, ctx.store
        self.cfg: Config = cfg
        self.backend: Backend = ctx.backend
        self.domain: Domain = ctx.domain
        self.store: RunStore = store
        self.emit: Callable[[Event], None] = ctx.emit
        self.evaluator = ctx.evaluator
        self.hosts = CandidateHosts(self.evaluator.host)  # one per candidate being advanced
        self.cycle = cycle
        root = (
            Path(phase_dir) if phase_dir else store.root / "harness_phases" / f"cycle-{cycle:02d}"
        )
        self.archive = PhaseArchive(root)
        if proposer is None:
            from whale_lab.search.proposers import make_proposer

            proposer = make_proposer(cfg)
        self.proposer = steered(proposer, ctx.emit)  # reviewers' steer notes reach it
        self.gate = gate or ApprovalGate.from_config(
            cfg.approval, reviewer, headless=reviewer is None
        )
        hs = cfg.harness_search
        if prompt_only is None:  # the schedule's phase spec may say; else the config does
            prompt_only = hs.prompt_only or cfg.schedule.kind == "prompt-only"
        self.prompt_only = bool(prompt_only)
        self.m = hs.candidates_per_iteration
        self.k = hs.rollouts_per_task
        self.sandbox = cfg.sandbox
        from whale_lab.evaluate import sampling_params

        self.params = sampling_params(cfg, seed=cfg.run.seed)
        self._tasks: list[Task] | None = None
        self._stop: Callable[[], bool] = _no
        self.state: dict[str, Any] = {}

    # ------------------------------------------------------------------ state
    @property
    def state_path(self) -> Path:
        return self.archive.root / "state.json"

    def _save(self) -> None:
        atomic_write_json(self.state_path, self.state)

    def _load_state(self, incoming: Path, iterations: int) -> None:
        old = read_json(self.state_path, {}) or {}
        self.state = {
            "incoming": str(old.get("incoming") or incoming),
            "iterations": int(iterations),
            "iteration": int(old.get("iteration", 1)),
            "proposed": list(old.get("proposed", [])),
            "done": list(old.get("done", [])),
            "history": list(old.get("history", [])),
            "rollouts": int(old.get("rollouts", 0)),
            "smoke_rollouts": int(old.get("smoke_rollouts", 0)),
            "pending": list(old.get("pending", [])),
            "usage": dict(old.get("usage", {})),
            "finished": bool(old.get("finished", False)),
            "accepted": old.get("accepted"),
            "reason": str(old.get("reason") or "budget"),
            # the last HarnessAccepted this phase wrote, and one being written (see _announce)
            "announced": old.get("announced"),
            "announcing": old.get("announcing"),
        }
        self._save()

    @property
    def tasks(self) -> list[Task]:
        if self._tasks is None:
            self._tasks = list(self.domain.tasks("harness"))
        return self._tasks

    # ------------------------------------------------------------------ public
    def pin(self, cid: str, reason: str = "", by: str = "human") -> None:
        """Pin a candidate for acceptance at the end of the phase (it must be scored by then)."""
        self.archive.pin(cid, by=by, reason=reason)
        self.emit(ReviewDecided(candidate_id=cid, decision="pin", reason=reason, by=by))
        self.archive.write_summary()

    def run(
        self,
        incoming_harness_path: str | Path,
        iterations: int | None = None,
        stop_when: Callable[[PhaseStatus], bool] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> PhaseResult:
        incoming = Path(incoming_harness_path)
        iterations = int(iterations or self.cfg.harness_search.iterations)
        if iterations < 1:
            raise HarnessPhaseError("a harness phase needs at least 1 iteration")
        self._stop = should_stop or _no
        self._load_state(incoming, iterations)
        if self.state["finished"]:
            # accepted before the last process ended: the acceptance stands, nothing is redone
            return self._result("completed", self.state["reason"], self.state["accepted"])
        if iterations == 1:  # iteration 1 only re-scores the incoming harness
            self.emit(Log(level="warning", message=ONE_ITERATION_NOTE))
        if not self.archive.ids():
            self._add_incoming(incoming)
        reason = "budget"
        try:
            while self.state["iteration"] <= iterations:
                it = int(self.state["iteration"])
                if it > 1 and it not in self.state["proposed"]:
                    self._check_stop()
                    if self._ids_of(it):  # a session cut short after writing candidates
                        self.state["proposed"].append(it)
                        self._save()
                    else:
                        self._propose(it)
                for cid in self._ids_of(it):
                    self._advance(cid)
                if it == 1 and self._paired and "noise_floor" not in self.state:
                    self._measure_noise_floor()
                if it not in self.state["done"]:
                    self.state["done"].append(it)
                best = self.archive.best()
                best_rate = self.archive.record(best).success_rate if best else None
                history = self.state["history"]
                new_best = best_rate is not None and (not history or best_rate > max(history))
                history.append(best_rate if best_rate is not None else 0.0)
                self.state["iteration"] = it + 1
                self._save()
                self.archive.write_summary()
                self.emit(
                    PhaseProgress(
                        cycle=self.cycle, phase="harness", done=float(it), budget=float(iterations)
                    )
                )
                status = PhaseStatus(
                    it,
                    iterations,
                    best,
                    best_rate,
                    tuple(history),
                    new_best,
                    int(self.state["rollouts"]),
                )
                if stop_when is not None and it < iterations and stop_when(status):
                    reason = "patience"
                    break
        except _Pending as p:
            self.state["pending"] = [p.cid]
            self._save()
            self.archive.write_summary()
            return self._result("pending", "pending", None, pending=(p.cid,))
        except _Stopped:
            self._save()
            self.archive.write_summary()
            accepted = self._accept("stopped early: best so far")
            return self._result("stopped", "stop", accepted)
        accepted = self._accept(
            "best success rate in the phase archive"
            if reason == "budget"
            else "patience: no new best"
        )
        self.state["finished"] = True
        self.state["accepted"] = accepted
        self.state["reason"] = reason
        self._save()
        return self._result("completed", reason, accepted)

    # ------------------------------------------------------------------ steps
    def _check_stop(self) -> None:
        if self._stop():
            raise _Stopped()

    def _ids_of(self, it: int) -> list[str]:
        return [
            c for c in self.archive.ids() if int(self.archive.meta(c).get("iteration", 0)) == it
        ]

    def _add_incoming(self, incoming: Path) -> None:
        from whale_lab.search.validate import static_validation

        if not incoming.is_file():
            raise HarnessPhaseError(f"incoming harness {incoming} not found")
        code = incoming.read_text(encoding="utf-8")
        cid = self.archive.add_candidate(
            code,
            parent_id="",
            hypothesis=f"The incoming harness ({incoming}), re-scored under the current weights.",
            surface="",
            proposer=INCOMING,
            iteration=1,
            extra={"source": str(incoming)},
        )
        result = static_validation(
            self.archive.folder(cid) / "harness.py", self.domain, self.sandbox
        )
        self.archive.write_json(cid, "validation", result.record())
        if not result.ok:
            self.archive.set_status(cid, "invalid", result.reason)
            raise HarnessPhaseError(f"the incoming harness is not valid: {result.reason}")
        self.archive.write_json(
            cid,
            "decision",
            {
                "decision": "approve",
                "reason": "incoming harness: always re-scored",
                "by": "phase",
                "ts": time.time(),
            },
        )
        self.archive.set_status(cid, "approved", "incoming harness")
        self.emit(
            CandidateProposed(
                cycle=self.cycle,
                iteration=1,
                candidate_id=cid,
                parent_id="",
                hypothesis=self.archive.hypothesis(cid),
                surface="",
                proposer=INCOMING,
            )
        )
        self.emit(CandidateValidated(candidate_id=cid, valid=True))

    def _propose(self, it: int) -> None:
        parent = self.archive.best() or self.archive.ids()[0]
        request = ProposalRequest(
            archive=self.archive,
            n=self.m,
            domain=self.domain.name,
            iteration=it,
            cycle=self.cycle,
            prompt_only=self.prompt_only,
            default_parent=parent,
        )
        name = getattr(self.proposer, "name", type(self.proposer).__name__)
        try:
            session = self.proposer.propose(request)
        except Exception as exc:  # noqa: BLE001 - a proposer failure is recorded; the phase goes on
            session = ProposalSession(error=f"{type(exc).__name__}: {exc}")
        added = []
        for cand in session.candidates[: self.m]:
            try:
                parent_code = self.archive.code(cand.parent_id) if cand.parent_id else ""
                cid = self.archive.add_candidate(
                    cand.code,
                    parent_id=cand.parent_id,
                    hypothesis=cand.hypothesis,
                    surface=cand.surface,
                    proposer=name,
                    iteration=it,
                    mechanism=cand.mechanism,
                    cited_traces=cand.cited_traces,
                    extra={"touched": changed_surfaces(parent_code, cand.code)},
                )
            except ArchiveError as exc:
                self.emit(Log(level="warning", message=f"proposal dropped: {exc}"))
                continue
            added.append(cid)
            self.emit(
                CandidateProposed(
                    cycle=self.cycle,
                    iteration=it,
                    candidate_id=cid,
                    parent_id=cand.parent_id,
                    hypothesis=cand.hypothesis,
                    surface=cand.surface,
                    proposer=name,
                    diff=self.archive.diff(cid),
                )
            )
        u = session.usage
        record = {
            "kind": "proposer",
            "proposer": name,
            "cycle": self.cycle,
            "iteration": it,
            "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens,
            "cost": u.cost,
            "seconds": round(u.seconds, 3),
            "tool_calls": u.tool_calls,
            "requests": u.requests,
            "candidates": added,
            "note": session.note,
            "error": session.error,
            "harness_rollouts": int(self.state["rollouts"]),
            "ts": time.time(),
        }
        for writer_path in (
            self.store.root / "proposer_ledger.jsonl",
            self.archive.root / "sessions.jsonl",
        ):
            w = JsonlWriter(writer_path)
            w.append(record)
            w.close()
        totals = self.state["usage"]
        for key in ("prompt_tokens", "completion_tokens", "cost", "seconds"):
            totals[key] = totals.get(key, 0) + record[key]
        self.emit(
            ProposerUsage(
                proposer=name,
                prompt_tokens=u.prompt_tokens,
                completion_tokens=u.completion_tokens,
                cost=u.cost,
                seconds=u.seconds,
            )
        )
        if session.error:
            self.emit(
                Log(
                    level="warning",
                    message=f"proposer session (iteration {it}) failed: {session.error}",
                )
            )
        elif session.note:
            self.emit(Log(level="info", message=f"proposer (iteration {it}): {session.note}"))
        self.state["proposed"].append(it)
        self._save()
        self.archive.write_summary()

    def _advance(self, cid: str) -> None:
        """Move one candidate through validate -> review -> score, as far as it can go."""
        with self.hosts.held(cid):
            for _ in range(4):
                status = self.archive.status(cid)
                if status in TERMINAL_STATUSES:
                    return
                self._check_stop()
                if status == "proposed":
                    self._validate(cid)
                elif status == "awaiting_review":
                    self._review(cid)
                elif status == "approved":
                    self._score(cid)

    def _incoming_id(self) -> str | None:
        ids = self._ids_of(1)
        return next((c for c in ids if self.archive.meta(c).get("proposer") == INCOMING), None)

    def _validate(self, cid: str, *, edited: bool = False) -> ValidationOutcome:
        # prompt-only candidates are held to the phase's h0 (the incoming harness), not the parent
        parent_id = self._incoming_id() if self.prompt_only else None
        parent_id = parent_id or str(self.archive.meta(cid).get("parent_id", ""))
        parent_code = self.archive.code(parent_id) if parent_id else None
        smoke_tasks = self.tasks[: self.cfg.harness_search.smoke_tasks]
        outcome = validate_candidate(
            self.archive.folder(cid) / "harness.py",
            self.evaluator,
            smoke_tasks=smoke_tasks,
            params=self.params,
            parent_code=parent_code,
            prompt_only=self.prompt_only,
            should_stop=self._stop,
            open_host=self.hosts.opener(cid, self.archive.folder(cid) / "harness.py"),
        )
        if outcome.stage == "stopped":
            raise _Stopped()
        self.state["rollouts"] += outcome.rollouts
        self.state["smoke_rollouts"] += outcome.rollouts
        self._save()
        self.archive.write_json(cid, "validation", outcome.record())
        if outcome.smoke:
            self.archive.write_json(cid, "smoke", outcome.smoke)
            self.archive.write_traces(cid, outcome.smoke_traces, name="smoke_traces")
        reason = outcome.reason if not edited else f"edited code: {outcome.reason}"
        self.emit(
            CandidateValidated(
                candidate_id=cid,
                valid=outcome.ok,
                reason=reason,
                smoke_success=outcome.smoke_success,
            )
        )
        if outcome.ok:
            if not edited:
                self.archive.set_status(cid, "awaiting_review")
        else:
            self.archive.set_status(cid, "invalid", reason)
        self.archive.write_summary()
        return outcome

    def _review(self, cid: str) -> None:
        rec = self.archive.record(cid)
        item = ReviewItem(
            candidate_id=cid,
            diff=self.archive.diff(cid),
            hypothesis=rec.hypothesis,
            surface=rec.surface,
            code=self.archive.code(cid),
            smoke_success=rec.smoke.get("success_rate"),
            cited_traces=rec.cited_traces,
        )
        self.emit(
            ReviewRequested(
                candidate_id=cid,
                diff=item.diff,
                hypothesis=item.hypothesis,
                surface=item.surface,
                smoke_success=item.smoke_success,
                cited_traces=item.cited_traces,
                noise_floor=str((self.state.get("noise_floor") or {}).get("note", "")),
                transcript=transcript_of(self.archive, cid, self.store.root),
            )
        )
        decision: ReviewDecision = self.gate.decide(item)
        if decision.decision == "pending":
            raise _Pending(cid)
        record = {
            "decision": decision.decision,
            "reason": decision.reason,
            "by": decision.by,
            "ts": time.time(),
            "edited": decision.decision == "edit",
        }
        self.archive.write_json(cid, "decision", record)
        self.emit(
            ReviewDecided(
                candidate_id=cid, decision=decision.decision, reason=decision.reason, by=decision.by
            )
        )
        if cid in self.state["pending"]:
            self.state["pending"].remove(cid)
            self._save()
        if decision.decision == "reject":
            self.archive.set_status(cid, "rejected", decision.reason)
        elif decision.decision == "edit":
            self.archive.replace_code(cid, decision.edited_code or self.archive.code(cid))
            outcome = self._validate(cid, edited=True)
            if outcome.ok:
                self.archive.set_status(cid, "approved", "edited then approved")
        else:
            if decision.decision == "pin":
                self.archive.pin(cid, by=decision.by, reason=decision.reason)
            self.archive.set_status(cid, "approved", decision.reason)
        self.archive.write_summary()

    def _score(self, cid: str) -> None:
        if self._paired and "noise_floor" not in self.state and cid == self._incoming_id():
            self._score_incoming_twice(cid)
            return
        folder = self.archive.folder(cid)
        traces_path = folder / "traces.jsonl"
        traces_path.unlink(missing_ok=True)  # a partial file from an interrupted scoring
        on_episode = EpisodeSink.for_file(
            traces_path, self.store.root, self.emit, phase="harness", harness=cid
        )

        error = ""
        report = None
        try:
            report = self.evaluator.score(
                folder / "harness.py",
                self.tasks,
                self.k,
                self.params,
                on_episode=on_episode,
                should_stop=self._stop,
                host=self.hosts.get(cid, folder / "harness.py"),
            )
        except (BackendError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the candidate's crash, recorded as such
            error = f"{type(exc).__name__}: {exc}"
        finally:
            on_episode.close()
        if self._stop():
            raise _Stopped()
        if report is None:
            self.emit(record_crash(self.archive, cid, error))
            self.archive.write_summary()
            return
        summary = write_scores(self.archive, cid, report)
        self.state["rollouts"] += report.rollouts
        self._save()
        self.emit(set_scored_status(self.archive, cid, report, summary))
        self.archive.write_summary()

    # ------------------------------------------------------------------ the noise floor
    @property
    def _paired(self) -> bool:
        return self.cfg.harness_search.acceptance == "paired"

    def _score_incoming_twice(self, cid: str) -> None:
        """The incoming harness's scoring and its repeat (other seeds) as two interleaved arms.

        Both share every generation call, so the noise floor measures the seeds' noise, not
        drift between two runs. Records what `_score` and then `_measure_noise_floor` would:
        the same traces files, events, scores and noise-floor record (a phase killed between
        the two writes measures the floor again alone on resume, with the same seeds).
        """
        folder = self.archive.folder(cid)
        path = folder / "harness.py"
        sinks = []
        for name, label in (("traces.jsonl", cid), ("traces_repeat.jsonl", f"{cid}-repeat")):
            (folder / name).unlink(missing_ok=True)  # a partial file from an interrupted scoring
            sinks.append(
                EpisodeSink.for_file(
                    folder / name, self.store.root, self.emit, phase="harness", harness=label
                )
            )
        host = self.hosts.get(cid, path)
        repeat_params = dataclasses.replace(self.params, seed=_mix(self.params.seed, REPEAT_SALT))
        error = ""
        reports = None
        try:
            reports = self.evaluator.score_arms(
                [
                    Arm(path, self.params, sinks[0], host),
                    Arm(path, repeat_params, sinks[1], host),
                ],
                self.tasks,
                self.k,
                should_stop=self._stop,
            )
        except (BackendError, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the candidate's crash, recorded as such
            error = f"{type(exc).__name__}: {exc}"
        finally:
            for sink in sinks:
                sink.close()
        if self._stop():
            raise _Stopped()
        if reports is None:
            self.emit(record_crash(self.archive, cid, error))
            self.archive.write_summary()
            return
        report, repeat = reports
        summary = write_scores(self.archive, cid, report)
        self.state["rollouts"] += report.rollouts
        self._save()
        self.emit(set_scored_status(self.archive, cid, report, summary))
        self.archive.write_summary()
        self.state["rollouts"] += repeat.rollouts
        if self.archive.status(cid) in SCORED_STATUSES:
            record = noise_floor_record(cid, self.archive.traces(cid), repeat.traces, self.k)
            self._record_noise_floor(cid, record)
        else:
            self._save()

    def _record_noise_floor(self, cid: str, record: dict[str, Any]) -> None:
        self.state["noise_floor"] = record
        self.archive.write_json(cid, "noise_floor", record)
        self._save()
        self.emit(Log(level="info", message=f"harness split noise floor: {record['note']}"))

    def _measure_noise_floor(self) -> None:
        """The incoming harness scored a second time and paired with the first (noise alone),
        where it was scored without its repeat (a phase resumed between the two records)."""
        incoming = self._incoming_id()
        if incoming is None or self.archive.status(incoming) not in SCORED_STATUSES:
            return
        record, rollouts = measure_noise_floor(
            self.archive,
            self.evaluator,
            incoming,
            self.tasks,
            self.k,
            self.params,
            root=self.store.root,
            emit=self.emit,
            should_stop=self._stop,
        )
        self._check_stop()
        self.state["rollouts"] += rollouts
        self._record_noise_floor(incoming, record)

    # ------------------------------------------------------------------ acceptance
    def _accept(self, why: str) -> str | None:
        pinned = self.archive.pinned()
        chosen, is_pinned = None, False
        if pinned:
            if self.archive.status(pinned) in SCORED_STATUSES:
                chosen, is_pinned = pinned, True
            else:
                self.emit(
                    Log(
                        level="warning",
                        message=(
                            f"pinned {pinned} is {self.archive.status(pinned)}, not scored; accepting the "
                            "best candidate instead"
                        ),
                    )
                )
        if chosen is None:
            hs = self.cfg.harness_search
            chosen = self.archive.best(min_gain=hs.min_gain, acceptance=hs.acceptance)
            note = self._paired and paired_acceptance_note(self.archive, hs.min_gain)
            if note:
                self.emit(Log(level="info", message=note))
        if chosen is None:
            self.emit(
                Log(
                    level="error",
                    message="no candidate of this phase could be scored; "
                    "the incoming harness stays",
                )
            )
            self.archive.write_summary()
            return None
        for rec in self.archive.records():
            if rec.status == "accepted" and rec.id != chosen:
                self.archive.set_status(rec.id, "evaluated", f"superseded by {chosen}")
        self.archive.set_status(chosen, "accepted", "pinned by a human" if is_pinned else why)
        rec = self.archive.record(chosen)
        self._announce(
            HarnessAccepted(
                cycle=self.cycle,
                candidate_id=chosen,
                success_rate=rec.success_rate or 0.0,
                path=str(rec.harness_path),
                pinned=is_pinned,
            )
        )
        self.archive.write_summary()
        return chosen

    def _announce(self, event: HarnessAccepted) -> None:
        """Emit an acceptance once: not again when it is the phase's last one already written.

        The phase can accept more than once (at a stop or a switch, then at its end), and a
        process killed after the event was written but before the phase recorded its end accepts
        again on resume. The candidate is marked `announcing` before the write and `announced`
        after it; a resumed phase that finds `announcing` set reads the event log to tell
        whether the write happened before the kill.
        """
        cid = event.candidate_id
        if self.state.get("announced") == cid:
            return
        if self.state.get("announcing") != cid or not last_acceptance_is(self.store.root, event):
            self.state["announcing"] = cid
            self._save()
            self.emit(event)
        self.state["announced"], self.state["announcing"] = cid, None
        self._save()

    def _result(
        self, status: str, reason: str, accepted: str | None, pending: tuple[str, ...] = ()
    ) -> PhaseResult:
        rec = self.archive.record(accepted) if accepted else None
        return PhaseResult(
            status=status,
            reason=reason,
            accepted_id=accepted,
            accepted_path=str(rec.harness_path) if rec else "",
            success_rate=rec.success_rate if rec else None,
            mean_turns=rec.mean_turns if rec else None,
            pinned=bool(rec and self.archive.pinned() == accepted),
            iterations_done=len(self.state["done"]),
            harness_rollouts=int(self.state["rollouts"]),
            archive_dir=str(self.archive.root),
            pending=pending,
            history=tuple(self.state["history"]),
            proposer_usage=dict(self.state["usage"]),
        )
