"""The alternation engine: runs a schedule's phases over one backend and one domain, steerable.

WHALE alternates a weight phase (online RSFT, `weights/rsft.py`) and a harness phase
(Meta-Harness, `search/meta_harness.py`). The engine owns one backend and one domain for the whole
run, so the harness phase scores under the *current* weights (the `hf` backend's model is trained
in place; adapter backends serve the adapter RSFT loaded), and the accepted harness goes into the
next weight phase. The weight phase's prompt sampler lives as long as the run.

The engine talks to the world through three seams only: events (`RunStore.emit`), a `Reviewer`
(through the approval gate) and a `CommandChannel` polled at safe points:

* pause: blocks at the next safe point until resume or stop;
* resume: ends a pause;
* switch: ends the current phase now (recorded with who asked and why); the next phase starts;
* probe: a bottleneck probe (`engine/probe.py`) at the next step or iteration boundary, which
  leaves the accepted weights and harness as they were unless asked to keep a result;
* stop: ends at a safe point; the run stays resumable.

Resume: each phase persists itself after every completed step (RSFT resume points) or iteration
(the phase archive), and the engine writes `state.json` (atomic) after each of them and at every
transition. A run killed at any moment continues from its last completed step or iteration with
weights, harness, sampler position, pending reviews and ledgers intact.

Selection without peeking: every evaluation point emits a val `EvalResult`, and a test one with
the same checkpoint key where val reaches a new best (every point with `eval.test_every =
"always"`); the run's result is the checkpoint best on val with its test score, and the
best-on-test figure (the paper's way) is reported beside it for comparison only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab import confine
from whale_lab.config import Config
from whale_lab.context import RunContext
from whale_lab.engine import runlock, selection
from whale_lab.engine.errors import EngineError
from whale_lab.engine.evaluation import EvaluationPoints
from whale_lab.engine.ledger import Ledger
from whale_lab.engine.phases import PhaseRunner
from whale_lab.engine.probe import ProbeSettings
from whale_lab.engine.probing import ProbeRunner
from whale_lab.engine.runbook import RunBook
from whale_lab.engine.runs import (
    create_run,
    from_cwd,
    load_or_new_state,
    load_run_config,
    open_engine,
)
from whale_lab.engine.safepoints import COMMANDS, SafePoints
from whale_lab.engine.schedules import PhaseSpec, plan
from whale_lab.events import (
    CandidateScored,
    CandidateValidated,
    CheckpointSaved,
    EpisodeFinished,
    EvalResult,
    Event,
    HarnessAccepted,
    Log,
    PhaseProgress,
    ProbeResult,
    ReviewDecided,
    RunFinished,
    RunStarted,
    WeightStep,
)
from whale_lab.seams import Command, CommandChannel, Reviewer
from whale_lab.store import RunStore

__all__ = [
    "COMMANDS",
    "Engine",
    "EngineError",
    "EngineStatus",
    "create_run",
    "load_run_config",
    "open_engine",
]

# Events after which no episode of the current step or iteration is in flight.
_BOUNDARY_EVENTS = (
    WeightStep,
    PhaseProgress,
    CandidateScored,
    CandidateValidated,
    ReviewDecided,
    CheckpointSaved,
    EvalResult,
)


@dataclass(frozen=True)
class EngineStatus:
    """What the engine is doing now, and which commands apply (for front ends)."""

    state: str  # "idle" | "starting" | "running" | "paused" | "probing" | "finished" | "failed"
    run_dir: str
    schedule: str
    phase_index: int
    phase_count: int
    cycle: int
    phase: str  # "weight" | "harness" | "" (between phases)
    phase_active: bool
    paused: bool
    stopping: bool
    probe_pending: bool
    probing: bool
    harness: str
    commands: frozenset[str]


class Engine:
    """One run of one schedule. `run()` blocks until the schedule is done or stopped."""

    def __init__(
        self,
        cfg: Config,
        store: RunStore,
        *,
        reviewer: Reviewer,
        commands: CommandChannel,
        backend: Any = None,
        domain: Any = None,
        probe_settings: ProbeSettings | None = None,
    ) -> None:
        from whale_lab.search.approval import ApprovalGate

        self.cfg = cfg
        self.store = store
        self.root = store.root
        self.reviewer = reviewer
        self.commands = commands
        self.plan: list[PhaseSpec] = plan(cfg.schedule)
        self.probe_settings = probe_settings or ProbeSettings()
        try:
            self.gate = ApprovalGate(cfg.approval.mode, cfg.approval.threshold, reviewer)
        except ValueError as exc:
            raise EngineError(str(exc)) from None
        self._backend = backend
        self._owns_backend = backend is None
        self._domain = domain
        self._owns_domain = domain is None
        self.points = SafePoints(
            commands,
            self._emit,
            validate_probe=lambda cmd: ProbeSettings.from_args(cmd.args, self.probe_settings),
            run_probe=lambda: self._probes().run(),
        )
        self.book = RunBook(store, load_or_new_state(cfg, store, self.plan))
        self._ctx: RunContext | None = None
        self._phases: PhaseRunner | None = None

    # ------------------------------------------------------------------ the run's pieces
    @property
    def state(self) -> Any:
        return self.book.state

    @property
    def harness_path(self) -> Path:
        """The accepted harness now (the one the next weight phase trains under)."""
        return self.book.harness_path

    @property
    def backend(self) -> Any:
        if self._backend is None:
            from whale_lab.backends import make_backend

            self._backend = make_backend(self.cfg)
        return self._backend

    @property
    def domain(self) -> Any:
        if self._domain is None:
            from whale_lab.domains import make_domain

            self._domain = make_domain(self.cfg)
        return self._domain

    @property
    def ctx(self) -> RunContext:
        if self._ctx is None:
            self._ctx = RunContext(self.cfg, self.backend, self.domain, self.store, self._emit)
        return self._ctx

    @property
    def phases(self) -> PhaseRunner:
        if self._phases is None:
            self._phases = PhaseRunner(
                self.ctx, self.book, self.points, reviewer=self.reviewer, gate=self.gate
            )
        return self._phases

    def _probes(self) -> ProbeRunner:
        return ProbeRunner(
            self.ctx,
            self.book,
            self.points,
            self.probe_settings,
            weights=self.phases.weights,
            cycle=lambda: self.phases.cycle,
        )

    # ------------------------------------------------------------------ status
    def applicable_commands(self) -> frozenset[str]:
        """Commands that do something in the current state (others would only be logged)."""
        return self.points.applicable()

    def status(self) -> EngineStatus:
        """A consistent snapshot; safe to call from any thread."""
        p = self.points
        with p.lock:
            return EngineStatus(
                state=p.state_name,
                run_dir=str(self.root),
                schedule=self.cfg.schedule.kind,
                phase_index=int(self.book.state.phase_index),
                phase_count=len(self.plan),
                cycle=self._phases.cycle if self._phases else 0,
                phase=self._phases.kind if self._phases and p.phase_active else "",
                phase_active=p.phase_active,
                paused=p.paused,
                stopping=p.stop_requested(),
                probe_pending=p.probe_request is not None,
                probing=p.in_probe,
                harness=str(self.book.state.harness),
                commands=p.applicable(),
            )

    # ------------------------------------------------------------------ events
    def _emit(self, ev: Event) -> None:
        """Every event goes through here: to the run folder, plus the engine's bookkeeping."""
        points = self.points
        if isinstance(ev, HarnessAccepted) and points.interrupt in ("stop", "probe"):
            # The phase was interrupted, not finished: it continues on resume.
            ev = Log(
                level="info",
                message=(
                    f"harness phase interrupted at a safe point; best so far {ev.candidate_id} "
                    f"({ev.success_rate:.1%} on the harness split); it continues where it was"
                ),
            )
        self.store.emit(ev)
        if isinstance(ev, EpisodeFinished):
            points.boundary = False
        elif isinstance(ev, _BOUNDARY_EVENTS):
            points.boundary = True
        if isinstance(ev, EvalResult) and ev.split == "test" and ev.phase == "weight":
            self.book.state.last_eval = self.book.identity()  # inside the weight phase
        if isinstance(ev, PhaseProgress):
            self.book.save()  # after every completed step or iteration

    def _log(self, message: str, level: str = "info") -> None:
        self._emit(Log(level=level, message=message))

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        """Run (or continue) the schedule; every event goes to the run folder."""
        runlock.acquire(self.root)
        try:
            self._run()
        except BaseException as exc:
            self.points.set("failed")
            interrupted = isinstance(exc, KeyboardInterrupt)
            message = "interrupted" if interrupted else f"{type(exc).__name__}: {exc}".strip()
            try:
                self.book.state.status = "stopped" if interrupted else "failed"
                self.book.state.message = message
                self.book.save()
                self.store.emit(RunFinished(status=self.book.state.status, message=message))
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
            raise
        finally:
            self._close()
            runlock.release(self.root)

    def _close(self) -> None:
        if self._owns_backend and self._backend is not None:
            try:
                self._backend.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass
            self._backend = None
        if self._owns_domain and self._domain is not None:
            close = getattr(self._domain, "close", None)
            if callable(close):
                try:
                    close()
                except Exception:  # noqa: BLE001
                    pass
            self._domain = None
        self._ctx, self._phases = None, None

    def _started(self, resumed: bool) -> None:
        self._emit(
            RunStarted(
                run_id=self.store.run_id,
                domain=self.domain.name,
                model=self.cfg.model.path,
                schedule=self.cfg.schedule.kind,
                harness=self.book.state.harness,
                config=self.cfg.to_dict(),
                resumed=resumed,
                plan=tuple(
                    {"cycle": p.cycle, "kind": p.kind, "budget": p.budget, "unit": p.unit}
                    for p in self.plan
                ),
                harness_source=from_cwd(self.book.state.base_harness_source),
            )
        )
        conf = confine.detect()  # recorded in every session of the run: confined or not
        self._log(f"sandbox: {conf.describe()}", "info" if conf.confined else "warning")

    def _preflight(self) -> None:
        """Every server the run needs answers before the first rollout (a one-line error if not):
        the model's, with the endpoint the weight phase publishes to when it publishes; the LLM
        proposer's when a harness phase left will ask it; the search judge's when it is on."""
        check = getattr(self.backend, "preflight", None)
        if callable(check) and getattr(self.backend, "verify", False):
            rsft = self.book.rsft
            check(adapters=rsft is not None and getattr(rsft, "mode", "") == "adapter")
        left = self.plan[int(self.book.state.phase_index) :]
        # a drawing phase has no proposer; a one-iteration phase only re-scores its harness
        asks = any(p.kind == "harness" and not p.draws and round(p.budget) > 1 for p in left)
        for endpoint in side_endpoints(self.cfg, proposer=asks):
            check_endpoint(endpoint)

    def _has_weight_state(self) -> bool:
        from whale_lab.weights.checkpoint import Checkpointer

        return Checkpointer(self.root / "weights").latest() is not None

    def _run(self) -> None:
        state, points = self.book.state, self.points
        if state.status == "completed":
            points.set("finished")  # nothing left to do; the result stands
            return
        resumed = state.status != "new"
        points.set("starting")
        points.stopping = False
        _ = self.domain
        _ = self.backend
        if self._has_weight_state() or any(p.kind == "weight" for p in self.plan):
            self.phases.weights()
        self._preflight()
        state.status = "running"
        self.book.save()
        self._started(resumed)
        if resumed:
            i = int(state.phase_index)
            where = f"phase {i + 1} of {len(self.plan)}" if i < len(self.plan) else "the end"
            self._log(f"resumed at {where}; harness {state.harness}")
        else:
            self._log(
                "plan: "
                + ", ".join(f"c{p.cycle} {p.kind} {p.budget:g} {p.unit}" for p in self.plan)
                + _final_weight_note(self.plan)
            )
        points.set("running")
        evaluation = EvaluationPoints(self.ctx, self.book, points)
        if not state.start_eval:
            if points.service() or not evaluation.evaluate_point(0, "start", "start"):
                return self._finish_stopped()
            state.start_eval = True
            self.book.save()
        while int(state.phase_index) < len(self.plan):
            if points.service():
                return self._finish_stopped()
            i = int(state.phase_index)
            spec = self.plan[i]
            if spec.kind == "weight":
                outcome = self.phases.weight_phase(i, spec)
            else:
                outcome = self.phases.harness_phase(i, spec)
            if outcome == "stopped":
                return self._finish_stopped()
            if outcome == "pending":
                return self._finish_pending()
            rec = state.record(i)
            if not rec.evaluated:
                key = f"p{i:02d}-c{spec.cycle}-{spec.kind}"
                if not evaluation.evaluate_point(spec.cycle, spec.kind, key):
                    return self._finish_stopped()
                rec.evaluated = True
            state.phase_index = i + 1
            self.book.save()
        if points.service():
            return self._finish_stopped()
        self._finish("completed", "")

    # ------------------------------------------------------------------ one probe, outside run()
    def probe_now(
        self, settings: ProbeSettings | None = None, *, by: str = "cli", reason: str = ""
    ) -> ProbeResult | None:
        """Run one probe on this run outside `run()` (for `whale-lab probe`); None if stopped."""
        import dataclasses

        runlock.acquire(self.root)
        state, points = self.book.state, self.points
        try:
            resumed = state.status != "new"
            points.set("starting")
            _ = self.domain
            _ = self.backend
            if self._has_weight_state():
                self.phases.weights()
            self._started(resumed)
            args = dataclasses.asdict(settings or self.probe_settings)
            points.set("running")
            points.accept(Command("probe", by=by, reason=reason, args=args))
            results: list[ProbeResult] = []
            self.store.subscribe(
                lambda ev: results.append(ev) if isinstance(ev, ProbeResult) else None
            )
            if points.probe_request is not None:
                self._probes().run()
            if state.status == "new":
                state.status = "stopped"
            self.book.save()
            if state.status == "completed":
                self._emit(
                    RunFinished(
                        status="completed", message="probed after completion", best=state.best
                    )
                )
            else:
                self._emit(
                    RunFinished(
                        status="stopped",
                        message="probe only; `whale-lab resume` runs the schedule from here",
                    )
                )
            points.set("finished")
            return results[-1] if results else None
        finally:
            self._close()
            runlock.release(self.root)

    # ------------------------------------------------------------------ ledger and result
    def ledger(self) -> Ledger:
        """Rebuilt from what is persisted, so it survives any kill unchanged."""
        return self.book.ledger()

    def best(self) -> dict[str, Any]:
        """Val-selected checkpoint with its test score, and the best-on-test figure beside it."""
        return selection.best(self.book)

    def _finish(self, status: str, message: str) -> None:
        chosen = selection.write_result(
            self.book,
            status,
            message,
            schedule=self.cfg.schedule.kind,
            domain=self.cfg.domain.name,
            seed=self.cfg.run.seed,
        )
        self._emit(RunFinished(status=status, message=message, best=chosen))
        self.points.set("finished")

    def _finish_stopped(self) -> None:
        self.points.poll()
        by = self.points.stop_by
        who = f" by {by}" if by else ""
        self._finish(
            "stopped", f"stopped at a safe point{who}; resume with `whale-lab resume {self.root}`"
        )

    def _finish_pending(self) -> None:
        pending = self.book.state.pending()
        self._finish(
            "stopped",
            f"{', '.join(pending) or 'a candidate'} awaits review; resume "
            f"with `whale-lab resume {self.root}`",
        )


@dataclass(frozen=True)
class SideEndpoint:
    """An OpenAI-compatible server a run needs besides the model's own backend."""

    what: str  # for the error line: "LLM proposer", "search judge"
    table: str  # its config table: "proposer", "domain.judge"
    base_url: str
    model: str
    api_key_env: str
    timeout_s: float


def side_endpoints(cfg: Config, *, proposer: bool) -> list[SideEndpoint]:
    """The LLM proposer's endpoint (when `proposer`: a harness phase will ask it, and no
    recorded session replaces it) and the search judge's (`[domain.judge]` enabled)."""
    out: list[SideEndpoint] = []
    p = cfg.proposer
    if proposer and p.kind == "llm" and not p.replay.strip():
        out.append(
            SideEndpoint(
                "LLM proposer", "proposer", p.base_url, p.model, p.api_key_env, p.request_timeout_s
            )
        )
    j = cfg.domain.judge
    if cfg.domain.name == "search" and j.enabled:
        out.append(
            SideEndpoint(
                "search judge", "domain.judge", j.base_url, j.model, j.api_key_env,
                j.request_timeout_s,
            )
        )  # fmt: skip
    return out


def check_endpoint(ep: SideEndpoint) -> None:
    """A one-token chat request to `ep`, so that a proposer or judge that is down, misnamed or
    refusing is one line (a `BackendError` naming the endpoint and its config key) before the
    first rollout, not a failed harness phase or a run judged by exact match alone."""
    import httpx

    from whale_lab.backends.base import BackendError
    from whale_lab.backends.openai_common import short, unreachable_reason

    key = ep.table
    where = f"the {ep.what} endpoint {ep.base_url} ({key}.base_url)"
    if not ep.base_url.startswith(("http://", "https://")):
        raise BackendError(
            f"{key}.base_url must start with http:// or https://, got {ep.base_url!r}"
        )
    if not ep.model.strip():
        raise BackendError(f"{key}.model is empty: set the model name {where} serves")
    headers = {"Content-Type": "application/json"}
    secret = os.environ.get(ep.api_key_env, "") if ep.api_key_env else ""
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    body = {
        "model": ep.model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    url = ep.base_url.rstrip("/") + "/chat/completions"
    timeout = httpx.Timeout(min(ep.timeout_s, 60.0), connect=min(ep.timeout_s, 10.0))
    failure = ""
    with httpx.Client(headers=headers, timeout=timeout) as client:
        for _ in range(2):  # one retry for a busy or restarting server
            try:
                resp = client.post(url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                raise BackendError(
                    f"cannot reach {where}: {unreachable_reason(exc)}; start that server or fix "
                    f"{key}.base_url"
                ) from None
            except httpx.HTTPError as exc:
                failure = f"{type(exc).__name__}: {exc}".strip()
                continue
            status = resp.status_code
            if status >= 500 or status == 429:
                failure = f"HTTP {status}: {short(resp.text, 200)}"
                continue
            if status >= 300:
                hint = (
                    f"; put its API key in ${ep.api_key_env} ({key}.api_key_env)"
                    if status in (401, 403)
                    else f"; check {key}.model and {key}.base_url"
                )
                raise BackendError(
                    f"{where} refused a one-token chat request for model {ep.model!r} "
                    f"({key}.model): HTTP {status}: {short(resp.text, 200)}{hint}"
                )
            return
    raise BackendError(
        f"{where} did not answer a one-token chat request for model {ep.model!r} ({failure})"
    )


def _final_weight_note(plan: list[PhaseSpec]) -> str:
    """Why an alternating plan lists one weight phase past its last cycle."""
    cycles = max((p.cycle for p in plan if p.kind == "harness"), default=0)
    last = plan[-1] if plan else None
    if last is None or last.kind != "weight" or not cycles or last.cycle <= cycles:
        return ""
    return (
        f" (the run ends on a weight phase: the harness chosen in cycle {cycles} is trained "
        "under once more before the final evaluation)"
    )
