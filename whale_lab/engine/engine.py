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

Selection without peeking: every evaluation point emits a val and a test `EvalResult` with the
same checkpoint key; the run's result is the checkpoint best on val with its test score, and the
best-on-test figure (the paper's way) is reported beside it for comparison only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.config import Config, ConfigError, config_from_dict
from whale_lab.engine.ledger import Ledger, PhaseLedger, ProbeLedger
from whale_lab.engine.probe import BottleneckProbe, ProbeSettings, ProbeStopped, val_params
from whale_lab.engine.schedules import (
    AdaptiveHarnessStop,
    AdaptiveWeightStop,
    PhaseSpec,
    plan,
)
from whale_lab.errors import WhaleLabError
from whale_lab.events import (
    CandidateScored,
    CandidateValidated,
    CheckpointSaved,
    CommandReceived,
    EpisodeFinished,
    EvalResult,
    Event,
    HarnessAccepted,
    Log,
    PhaseEnded,
    PhaseProgress,
    PhaseStarted,
    ProbeResult,
    ReviewDecided,
    RunFinished,
    RunStarted,
    WeightStep,
)
from whale_lab.seams import Command, CommandChannel, Reviewer
from whale_lab.store import RunStore, atomic_write_json, read_json

ENGINE_VERSION = 1
LOCK_FILE = "engine.lock"
RESULT_FILE = "result.json"
COMMANDS = ("pause", "resume", "switch", "probe", "stop")
SELECTION_RULE = "the checkpoint (weights + harness) best on val; test reported at that point"
PAPER_RULE = "best on test, the paper's way: for comparison only, never for selection"


class EngineError(WhaleLabError, RuntimeError):
    """A problem with a run folder a user can act on (missing, foreign, already open)."""


@dataclass(frozen=True)
class EngineStatus:
    """What the engine is doing now, and which commands apply (for the TUI's controls)."""

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


def _sha(path: str | Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        self._rsft: Any = None
        self._hp: Any = None  # the harness phase running now
        self._current_harness_index = -1
        self._lock = threading.Lock()
        self._state_name = "idle"
        self._cycle = 0
        self._phase_kind = ""
        self._phase_active = False
        self._paused = False
        self._stopping = False
        self._stop_by = ""
        self._switch: Command | None = None
        self._probe_request: Command | None = None
        self._in_probe = False
        self._boundary = True
        self._interrupt = ""  # why the phase's should_stop last returned True
        self.state = self._load_or_new_state()

    # ------------------------------------------------------------------ state
    def _load_or_new_state(self) -> dict[str, Any]:
        state = self.store.read_state()
        if state:
            if "engine_version" not in state:
                raise EngineError(
                    f"{self.root} is not a run of the engine (its state.json was written by "
                    "another command, e.g. `whale-lab train`); resume it with that command"
                )
            if int(state["engine_version"]) != ENGINE_VERSION:
                raise EngineError(
                    f"{self.root}: state version {state['engine_version']} is not "
                    f"{ENGINE_VERSION}; made by another whale-lab version"
                )
            saved_plan = [PhaseSpec(**p) for p in state.get("plan", [])]
            if saved_plan != self.plan:
                raise EngineError(
                    f"{self.root}: the schedule in config.json gives another phase plan than the "
                    "one this run started with; the run folder was edited"
                )
            return state
        from whale_lab.evaluate import default_harness_path

        src = default_harness_path(self.cfg)
        if not src.is_file():
            raise EngineError(f"domain.harness: harness file {src} not found")
        dst = self.root / "harnesses" / src.name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if not dst.exists():
            shutil.copyfile(src, dst)
        if not (self.root / "config.json").exists():
            atomic_write_json(self.root / "config.json", self.cfg.to_dict())
        rel = self._rel(dst)
        return {
            "engine_version": ENGINE_VERSION,
            "run_id": self.store.run_id,
            "schedule": self.cfg.schedule.kind,
            "plan": [dataclasses.asdict(p) for p in self.plan],
            "status": "new",
            "message": "",
            "phase_index": 0,
            "phases": [],
            "harness": rel,
            "base_harness": rel,
            "base_harness_source": str(src),
            "start_eval": False,
            "checkpoints": {},
            "eval_rollouts": 0,
            "last_eval": None,
            "probes": [],
            "probe_rollouts": 0,
            "probe_usage": {},
            "kept_probe_rollouts": 0,
            "kept_harness_rollouts": 0,
            "kept_weights": 0,
            "weights_ref": None,
            "switches": [],
            "weights": {
                "rollouts": 0,
                "eval_rollouts": 0,
                "step": 0,
                "updates": 0,
                "sampler": None,
            },
            "ledger": Ledger().to_dict(),
            "best": {},
        }

    def _save(self) -> None:
        """state.json and ledger.json, both atomic."""
        r = self._rsft
        if r is not None:
            self.state["weights"] = {
                "rollouts": int(r.rollouts),
                "eval_rollouts": int(r.eval_rollouts),
                "step": int(r.step),
                "updates": int(r.updates),
                "sampler": r.sampler.state_dict(),
            }
        ledger = self.ledger()
        self.state["ledger"] = ledger.to_dict()
        self.state["updated"] = time.time()
        self.store.write_state(self.state)
        ledger.write(self.root)

    def _rel(self, path: str | Path) -> str:
        p = Path(path)
        try:
            return p.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(p)

    def _abs(self, path: str | Path) -> Path:
        p = Path(path)
        return p if p.is_absolute() else self.root / p

    @property
    def harness_path(self) -> Path:
        """The accepted harness now (the one the next weight phase trains under)."""
        return self._abs(self.state["harness"])

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

    # ------------------------------------------------------------------ status for the TUI
    def _set(self, name: str) -> None:
        with self._lock:
            self._state_name = name

    def applicable_commands(self) -> frozenset[str]:
        """Commands that do something in the current state (others would only be logged)."""
        if self._state_name not in ("starting", "running", "paused", "probing"):
            return frozenset()
        if self._stopping or self.commands.stop_requested.is_set():
            return frozenset()
        out = {"stop", "resume" if self._paused else "pause"}
        if self._phase_active and self._switch is None:
            out.add("switch")
        if not self._in_probe and self._probe_request is None:
            out.add("probe")
        return frozenset(out)

    def status(self) -> EngineStatus:
        """A consistent snapshot; safe to call from any thread."""
        with self._lock:
            spec_count = len(self.plan)
            return EngineStatus(
                state=self._state_name,
                run_dir=str(self.root),
                schedule=self.cfg.schedule.kind,
                phase_index=int(self.state.get("phase_index", 0)),
                phase_count=spec_count,
                cycle=self._cycle,
                phase=self._phase_kind if self._phase_active else "",
                phase_active=self._phase_active,
                paused=self._paused,
                stopping=self._stopping or self.commands.stop_requested.is_set(),
                probe_pending=self._probe_request is not None,
                probing=self._in_probe,
                harness=str(self.state.get("harness", "")),
                commands=self.applicable_commands(),
            )

    # ------------------------------------------------------------------ events
    def _emit(self, ev: Event) -> None:
        """Every event goes through here: to the run folder, plus the engine's bookkeeping."""
        if isinstance(ev, HarnessAccepted) and self._interrupt in ("stop", "probe"):
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
            self._boundary = False
        elif isinstance(
            ev,
            (
                WeightStep,
                PhaseProgress,
                CandidateScored,
                CandidateValidated,
                ReviewDecided,
                CheckpointSaved,
                EvalResult,
            ),
        ):
            self._boundary = True
        if isinstance(ev, EvalResult) and ev.split == "test" and ev.phase == "weight":
            self.state["last_eval"] = self._identity()  # an evaluation inside the weight phase
        if isinstance(ev, PhaseProgress):
            self._save()  # after every completed step or iteration

    def _log(self, message: str, level: str = "info") -> None:
        self._emit(Log(level=level, message=message))

    # ------------------------------------------------------------------ commands
    def _poll(self) -> None:
        for cmd in self.commands.drain():
            self._accept(cmd)

    def _stop_requested(self) -> bool:
        return self._stopping or self.commands.stop_requested.is_set()

    def _accept(self, cmd: Command) -> None:
        kind = cmd.kind
        if kind not in COMMANDS:
            self._log(f"unknown command {kind!r} from {cmd.by} ignored", "warning")
            return
        if kind == "stop":
            if self._stopping:
                return
            self._stopping, self._paused = True, False
            self._stop_by = f"{cmd.by}" + (f" ({cmd.reason})" if cmd.reason else "")
            self.commands.paused.clear()
        elif kind == "pause":
            if self._paused or self._stop_requested():
                self._log(f"pause from {cmd.by} ignored: already paused or stopping", "warning")
                return
            self._paused = True
            self.commands.paused.set()
        elif kind == "resume":
            if not self._paused:
                self._log(f"resume from {cmd.by} ignored: the run is not paused", "warning")
                return
            self._paused = False
            self.commands.paused.clear()
        elif kind == "switch":
            if not self._phase_active or self._switch is not None:
                self._log(f"switch from {cmd.by} ignored: no phase is running now", "warning")
                return
            self._switch = cmd
        elif kind == "probe":
            if self._probe_request is not None or self._in_probe:
                self._log(f"probe from {cmd.by} ignored: a probe is already pending", "warning")
                return
            try:
                ProbeSettings.from_args(cmd.args, self.probe_settings)
            except ValueError as exc:
                self._log(f"probe from {cmd.by} ignored: {exc}", "warning")
                return
            self._probe_request = cmd
        self._emit(CommandReceived(command=kind, by=cmd.by, reason=cmd.reason))

    def _wait_paused(self, *, wake_for_work: bool = True) -> None:
        """Block while paused; wake for resume or stop, and (unless `wake_for_work` is off,
        as inside an evaluation) for a switch or a probe request."""
        before = self._state_name
        self._set("paused")
        self._log("paused at a safe point")
        while self._paused and not self._stop_requested():
            if wake_for_work and (self._switch is not None or self._probe_request is not None):
                break
            self.commands.stop_requested.wait(0.05)
            self._poll()
        if not self._paused and not self._stop_requested():
            self._log("resumed")
        self._set(before if before != "paused" else "running")

    def _interrupt_phase(self) -> bool:
        """The phases' `should_stop`: True ends the phase's `run` at its last safe point."""
        self._poll()
        if self._stop_requested():
            self._interrupt = "stop"
            return True
        if self._switch is not None:
            self._interrupt = "switch"
            return True
        if self._paused:
            self._wait_paused()  # waits here, mid-step, losing nothing
            if self._stop_requested():
                self._interrupt = "stop"
                return True
            if self._switch is not None:
                self._interrupt = "switch"
                return True
            if self._probe_request is not None:
                self._interrupt = "probe"
                return True
            return False
        if self._probe_request is not None and self._boundary:
            self._interrupt = "probe"
            return True
        return False

    def _eval_should_stop(self) -> bool:
        """Evaluations stop only for a stop (a pause waits; probes and switches come after)."""
        self._poll()
        if self._paused and not self._stop_requested():
            self._wait_paused(wake_for_work=False)
        return self._stop_requested()

    def _after_interrupt(self) -> str:
        """After a phase returned at a safe point: run a probe, wait out a pause, then say
        whether the phase goes on ("continue"), ends ("switch") or the run stops ("stop")."""
        while True:
            self._poll()
            if self._stop_requested():
                return "stop"
            if self._switch is not None:
                return "switch"
            if self._probe_request is not None:
                self._run_probe()
                continue
            if self._paused:
                self._wait_paused()
                continue
            self._interrupt = ""
            return "continue"

    def _service(self) -> bool:
        """Between phases: probes and pauses; True when the run must stop."""
        while True:
            self._poll()
            if self._stop_requested():
                return True
            if self._probe_request is not None:
                self._run_probe()
                continue
            if self._paused:
                self._wait_paused()
                continue
            return False

    # ------------------------------------------------------------------ the run
    def run(self) -> None:
        """Run (or continue) the schedule; every event goes to the run folder."""
        self._acquire_lock()
        try:
            self._run()
        except BaseException as exc:
            self._set("failed")
            message = f"{type(exc).__name__}: {exc}".strip()
            if isinstance(exc, KeyboardInterrupt):
                message = "interrupted"
            try:
                self.state["status"] = (
                    "failed" if not isinstance(exc, KeyboardInterrupt) else "stopped"
                )
                self.state["message"] = message
                self._save()
                self.store.emit(RunFinished(status=self.state["status"], message=message))
            except Exception:  # noqa: BLE001 - the original error matters more
                pass
            raise
        finally:
            self._close()
            self._release_lock()

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

    def _run(self) -> None:
        if self.state.get("status") == "completed":
            self._set("finished")  # nothing left to do; the result stands
            return
        resumed = self.state.get("status") != "new"
        self._set("starting")
        self._stopping = False
        _ = self.domain
        _ = self.backend
        if self._has_weight_state() or any(p.kind == "weight" for p in self.plan):
            self._weights()
        self.state["status"] = "running"
        self._save()
        self._emit(
            RunStarted(
                run_id=self.store.run_id,
                domain=self.domain.name,
                model=self.cfg.model.path,
                schedule=self.cfg.schedule.kind,
                harness=self.state["harness"],
                config=self.cfg.to_dict(),
                resumed=resumed,
            )
        )
        if resumed:
            i = int(self.state["phase_index"])
            where = f"phase {i + 1} of {len(self.plan)}" if i < len(self.plan) else "the end"
            self._log(f"resumed at {where}; harness {self.state['harness']}")
        else:
            self._log(
                "plan: "
                + ", ".join(f"c{p.cycle} {p.kind} {p.budget:g} {p.unit}" for p in self.plan)
            )
        self._set("running")
        if not self.state["start_eval"]:
            if self._service():
                return self._finish_stopped()
            if not self._evaluate_point(0, "start", "start"):
                return self._finish_stopped()
            self.state["start_eval"] = True
            self._save()
        while int(self.state["phase_index"]) < len(self.plan):
            if self._service():
                return self._finish_stopped()
            i = int(self.state["phase_index"])
            spec = self.plan[i]
            if spec.kind == "weight":
                outcome = self._weight_phase(i, spec)
            else:
                outcome = self._harness_phase(i, spec)
            if outcome == "stopped":
                return self._finish_stopped()
            if outcome == "pending":
                return self._finish_pending()
            rec = self._record(i)
            if not rec.get("evaluated"):
                if not self._evaluate_point(
                    spec.cycle, spec.kind, f"p{i:02d}-c{spec.cycle}-{spec.kind}"
                ):
                    return self._finish_stopped()
                rec["evaluated"] = True
            self.state["phase_index"] = i + 1
            self._save()
        if self._service():
            return self._finish_stopped()
        self._finish("completed", "")

    # ------------------------------------------------------------------ weights
    def _has_weight_state(self) -> bool:
        from whale_lab.weights.checkpoint import Checkpointer

        return Checkpointer(self.root / "weights").latest() is not None

    def _weights(self) -> Any:
        """The run's weight phase object (created once; resumed from its last resume point)."""
        if self._rsft is None:
            from whale_lab.weights.rsft import RsftPhase

            r = RsftPhase(
                self.cfg, self.backend, self.domain, self.store, self._emit, cycle=self._cycle
            )
            if r.resume() and getattr(r, "mode", "") == "adapter" and r.updates > 0:
                # a server starts on the base model: serve the resumed adapter before anything
                # (a harness phase resumed next must score under these weights)
                publish = getattr(r, "publish", None) or r._publish
                publish(initial=True)
            self._rsft = r
        return self._rsft

    def _weight_rollouts(self) -> int:
        r = self._rsft
        return int(r.rollouts) if r is not None else int(self.state["weights"]["rollouts"])

    def _weight_eval_rollouts(self) -> int:
        r = self._rsft
        return (
            int(r.eval_rollouts) if r is not None else int(self.state["weights"]["eval_rollouts"])
        )

    def _weights_identity(self) -> str:
        r = self._rsft
        base = f"rsft:{r.step}:{r.updates}" if r is not None and r.updates > 0 else "base"
        return f"{base}:kept{self.state['kept_weights']}"

    def _identity(self) -> str:
        """What an evaluation point evaluates: these weights with this harness."""
        return f"{self._weights_identity()}|{_sha(self.harness_path)}"

    def _weight_rule(self, spec: PhaseSpec, rsft: Any) -> Callable[[Sequence[WeightStep]], bool]:
        """The adaptive rule replayed over the phase's steps (so a resumed phase sees them all)."""
        steps_per_epoch = len(rsft.weight_tasks) / self.cfg.rsft.prompts_per_step
        schedule = self.cfg.schedule

        def stop_when(history: Sequence[WeightStep]) -> bool:
            rule = AdaptiveWeightStop(steps_per_epoch, schedule)  # type: ignore[arg-type]
            fire = False
            for step in history:
                fire = rule.update(step.train_reward)
            return fire

        return stop_when

    def _weight_phase(self, i: int, spec: PhaseSpec) -> str:
        rsft = self._weights()
        rec = self._open_phase(i, spec)
        if rec["status"] == "running":
            reason = ""
            if not rsft.phase_active and rsft.step > int(rec["start_step"]):
                # the phase finished before the last process ended, and was not recorded
                done = rsft.step - int(rec["start_step"])
                short = spec.adaptive and done < rsft.steps_for(spec.budget)
                reason = "patience" if short else "budget"
            rule = self._weight_rule(spec, rsft) if spec.adaptive else None
            self._phase_active = True
            try:
                while not reason:
                    self._boundary, self._interrupt = True, ""
                    rsft.harness_rollouts = self._harness_rollouts()
                    result = rsft.run(
                        self.harness_path,
                        epochs=spec.budget,
                        stop_when=rule,
                        should_stop=self._interrupt_phase,
                        cycle=spec.cycle,
                        final_eval=True,
                    )
                    if result.reason != "stop":
                        reason = "patience" if result.reason == "stop_when" else "budget"
                        break
                    action = self._after_interrupt()
                    if action == "stop":
                        return "stopped"
                    if action == "switch":
                        self._record_switch(rec)
                        reason = "switch"
            finally:
                self._phase_active = False
                self._interrupt = ""
            rec.update(status="ending", reason=reason)
            self._save()
        if rec["status"] == "ending":
            if rsft.phase_active:
                rsft.end_phase()
            rec["end_step"] = int(rsft.step)
            rec["end_weight_rollouts"] = int(rsft.rollouts)
            self._emit(
                PhaseEnded(
                    cycle=spec.cycle,
                    phase="weight",
                    reason=rec["reason"],
                    weight_rollouts=self._weight_rollouts(),
                    harness_rollouts=self._harness_rollouts(),
                )
            )
            rec["status"] = "ended"
            self._save()
        return "ended"

    # ------------------------------------------------------------------ harness
    def _archive_state(self, rec: dict[str, Any]) -> dict[str, Any]:
        hp = self._hp
        if hp is not None and self._record_index(rec) == self._current_harness_index:
            return hp.state
        data = read_json(self._abs(rec["dir"]) / "state.json", {})
        return data if isinstance(data, dict) else {}

    @staticmethod
    def _record_index(rec: dict[str, Any]) -> int:
        return int(rec["index"])

    def _harness_rollouts(self) -> int:
        total = int(self.state.get("kept_harness_rollouts", 0))
        for rec in self.state["phases"]:
            if rec["kind"] == "harness":
                total += int(self._archive_state(rec).get("rollouts", 0))
        return total

    def _harness_rule(self) -> Callable[[Any], bool]:
        schedule = self.cfg.schedule

        def stop_when(status: Any) -> bool:
            rule = AdaptiveHarnessStop(schedule)
            fire = False
            for best in status.history:
                fire = rule.update(best)
            return fire

        return stop_when

    def _harness_phase(self, i: int, spec: PhaseSpec) -> str:
        from whale_lab.search.meta_harness import HarnessPhase

        rec = self._open_phase(i, spec)
        if rec["status"] == "running":
            hp = HarnessPhase(
                self.cfg,
                self.backend,
                self.domain,
                self.store,
                self._emit,
                self.reviewer,
                cycle=spec.cycle,
                phase_dir=self._abs(rec["dir"]),
                gate=self.gate,
            )
            self._hp, self._current_harness_index = hp, i
            rule = self._harness_rule() if spec.adaptive else None
            reason, accepted = "", ""
            self._phase_active = True
            try:
                while not reason:
                    self._boundary, self._interrupt = True, ""
                    result = hp.run(
                        self._abs(rec["incoming"]),
                        iterations=int(round(spec.budget)),
                        stop_when=rule,
                        should_stop=self._interrupt_phase,
                    )
                    if result.status == "completed":
                        reason, accepted = result.reason, result.accepted_path
                        break
                    if result.status == "pending":
                        self._poll()
                        rec["pending"] = list(result.pending)
                        self._save()
                        return "stopped" if self._stop_requested() else "pending"
                    action = self._after_interrupt()
                    if action == "stop":
                        return "stopped"
                    if action == "switch":
                        self._record_switch(rec)
                        reason, accepted = "switch", result.accepted_path
            finally:
                self._phase_active = False
                self._interrupt = ""
                self._save()
                self._hp, self._current_harness_index = None, -1
            rec.update(
                status="ending",
                reason=reason,
                pending=[],
                accepted=self._rel(accepted) if accepted else rec["incoming"],
            )
            self._save()
        if rec["status"] == "ending":
            self.state["harness"] = rec["accepted"]
            self._emit(
                PhaseEnded(
                    cycle=spec.cycle,
                    phase="harness",
                    reason=rec["reason"],
                    weight_rollouts=self._weight_rollouts(),
                    harness_rollouts=self._harness_rollouts(),
                )
            )
            rec["status"] = "ended"
            self._save()
        return "ended"

    # ------------------------------------------------------------------ phases, common
    def _record(self, i: int) -> dict[str, Any]:
        for rec in self.state["phases"]:
            if int(rec["index"]) == i:
                return rec
        raise KeyError(i)

    def _open_phase(self, i: int, spec: PhaseSpec) -> dict[str, Any]:
        """The phase's record (made on first entry); PhaseStarted for a phase that runs now."""
        try:
            rec = self._record(i)
        except KeyError:
            rec = {
                "index": i,
                "kind": spec.kind,
                "cycle": spec.cycle,
                "budget": spec.budget,
                "adaptive": spec.adaptive,
                "status": "running",
                "reason": "",
                "started": time.time(),
                "incoming": self.state["harness"],
                "start_weight_rollouts": self._weight_rollouts(),
            }
            if spec.kind == "weight":
                rec["start_step"] = int(self._weights().step)
            else:
                name = f"cycle-{spec.cycle:02d}"
                used = {r.get("dir") for r in self.state["phases"]}
                folder = f"harness_phases/{name}"
                if folder in used:
                    folder = f"harness_phases/{name}-p{i:02d}"
                rec["dir"] = folder
            self.state["phases"].append(rec)
            self._save()
        self._cycle, self._phase_kind = spec.cycle, spec.kind
        if rec["status"] == "running":
            self._emit(
                PhaseStarted(
                    cycle=spec.cycle,
                    phase=spec.kind,
                    budget=float(spec.budget),
                    budget_unit=spec.unit,
                    harness=str(rec["incoming"]),
                )
            )
        return rec

    def _record_switch(self, rec: dict[str, Any]) -> None:
        cmd = self._switch
        self._switch = None
        entry = {
            "phase_index": rec["index"],
            "phase": rec["kind"],
            "cycle": rec["cycle"],
            "by": cmd.by if cmd else "",
            "reason": cmd.reason if cmd else "",
            "ts": time.time(),
        }
        rec["switch"] = entry
        self.state["switches"].append(entry)
        why = f": {entry['reason']}" if entry["reason"] else ""
        self._log(
            f"cycle {rec['cycle']} {rec['kind']} phase ended by a switch from {entry['by']}{why}"
        )

    # ------------------------------------------------------------------ evaluations
    def _evaluate_point(self, cycle: int, phase: str, key: str) -> bool:
        """A val+test evaluation of the current weights and accepted harness (skipped when
        neither changed since the last one). False when a stop interrupted it."""
        if self.state.get("last_eval") == self._identity():
            self._log(
                f"{phase} evaluation skipped: weights and harness are those of the last "
                "evaluation point"
            )
            return True
        r = self._rsft
        if phase == "weight" and r is not None and not (r.evals and r.evals[-1].step == r.step):
            # a weight-phase checkpoint (the weight phase keys its checkpoints by step)
            self._rsft.harness_rollouts = self._harness_rollouts()
            if self._rsft.evaluate(self.harness_path, should_stop=self._eval_should_stop) is None:
                return False
            self.state["last_eval"] = self._identity()
            self._save()
            return True
        return self._engine_evaluation(cycle, phase, key)

    def _engine_evaluation(self, cycle: int, phase: str, key: str) -> bool:
        from whale_lab.evaluate import score_harness
        from whale_lab.harness import HarnessHost

        harness = self.harness_path
        k = self.cfg.sampling.k
        reports: dict[str, Any] = {}
        host = HarnessHost(harness, self.domain.name, self.cfg.sandbox)
        try:
            for idx, split in enumerate(("val", "test")):
                tasks = list(self.domain.tasks(split))
                report = score_harness(
                    self.domain,
                    harness,
                    tasks,
                    k,
                    self.backend,
                    val_params(self.cfg, idx),
                    sandbox=self.cfg.sandbox,
                    max_context_tokens=self.cfg.model.max_context_tokens,
                    batch_episodes=max(1, self.cfg.sampling.batch_size) * 4,
                    on_episode=self._eval_sink(split, cycle, host.info.name),
                    should_stop=self._eval_should_stop,
                    host=host,
                )
                if report.rollouts < len(tasks) * k:
                    return False
                reports[split] = report
        finally:
            host.close()
        folder = self.root / "checkpoints" / key
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(harness, folder / "harness.py")
        weights = self._weights_ref(folder)
        val, test = reports["val"], reports["test"]
        meta = {
            "key": key,
            "cycle": cycle,
            "phase": phase,
            "harness": self.state["harness"],
            "weights": weights,
            "val_mean_at_k": val.mean_at_k,
            "test_mean_at_k": test.mean_at_k,
            "k": k,
            "weight_rollouts": self._weight_rollouts(),
            "harness_rollouts": self._harness_rollouts(),
            "ts": time.time(),
        }
        atomic_write_json(folder / "checkpoint.json", meta)
        self.state["eval_rollouts"] = (
            int(self.state["eval_rollouts"]) + val.rollouts + test.rollouts
        )
        self.state["checkpoints"][self._rel(folder)] = meta
        for split, rep in reports.items():
            self._emit(
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
                    weight_rollouts=self._weight_rollouts(),
                    harness_rollouts=self._harness_rollouts(),
                    diagnostics={
                        kk: float(v)
                        for kk, v in rep.diagnostics.items()
                        if isinstance(v, (int, float)) and math.isfinite(float(v))
                    },
                )
            )
        self.state["last_eval"] = self._identity()
        self._save()
        return True

    def _eval_sink(self, split: str, cycle: int, harness: str) -> Callable[[Any], None]:
        writer = self.store.trace_writer(f"eval-{split}")
        rel = f"traces/eval-{split}.jsonl"

        def sink(trace: Any) -> None:
            rec = trace.to_dict()
            rec["info"] = {**rec.get("info", {}), "cycle": cycle, "engine_eval": True}
            line = writer.append(rec)
            self._emit(
                EpisodeFinished(
                    phase="eval",
                    task_id=trace.task_id,
                    sample=trace.sample,
                    turns=trace.n_turns,
                    reward=trace.reward,
                    stop_reason=trace.stop_reason,
                    tokens=trace.prompt_tokens + trace.completion_tokens,
                    harness=harness,
                    trace_path=rel,
                    trace_line=line,
                )
            )

        return sink

    def _weights_ref(self, folder: Path) -> str:
        """Where the weights of an evaluation point can be found (saved now if nowhere)."""
        r = self._rsft
        if r is None or (r.updates == 0 and not self.state["kept_weights"]):
            return f"base:{self.cfg.model.path}"
        ident = self._weights_identity()
        ref = self.state.get("weights_ref")
        if isinstance(ref, dict) and ref.get("identity") == ident:
            return str(ref["path"])
        if r.evals and r.evals[-1].step == r.step and not self._kept_since_eval():
            return self._rel(r.evals[-1].checkpoint)
        path = folder / "weights"
        r.tm.save_pretrained(path)
        self.state["weights_ref"] = {"identity": ident, "path": self._rel(path)}
        return self._rel(path)

    def _kept_since_eval(self) -> bool:
        """Whether probe weights were kept after the weight phase's last evaluation."""
        r = self._rsft
        last = self.state.get("kept_weights_at")
        return bool(
            last
            and r is not None
            and r.evals
            and int(last["evals"]) == len(r.evals)
            and int(last["step"]) == r.step
        )

    # ------------------------------------------------------------------ probes
    def _run_probe(self) -> None:
        cmd = self._probe_request
        assert cmd is not None
        settings = ProbeSettings.from_args(cmd.args, self.probe_settings)
        before = self._state_name
        self._in_probe = True
        self._set("probing")
        index = self._next_probe_index()
        probe = BottleneckProbe(
            self.cfg,
            self.backend,
            self.domain,
            self.store,
            self._emit,
            index=index,
            harness_path=self.harness_path,
            run_weights=self._rsft,
            settings=settings,
            cycle=self._cycle,
            should_stop=self._probe_should_stop,
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
            self._emit(
                ProbeResult(
                    harness_gain_per_1k=0.0,
                    weight_gain_per_1k=0.0,
                    recommendation=f"The probe failed: {exc}",
                    evidence=(f"{type(exc).__name__}: {exc}",),
                )
            )
            return
        finally:
            self._probe_request = None
            self._in_probe = False
            self._set(before if before != "probing" else "running")
        kept = self._apply_keep(report)
        usage = dict(report.harness.usage)
        totals = self.state["probe_usage"]
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
        self.state["probes"].append(
            {
                **dataclasses.asdict(entry),
                "kept": list(kept),
                "folder": self._rel(report.folder),
                "recommendation": report.recommendation.text,
                "side": report.recommendation.side,
                "by": cmd.by,
                "reason": cmd.reason,
            }
        )
        self.state["probe_rollouts"] = int(self.state["probe_rollouts"]) + report.rollouts
        self.state["kept_probe_rollouts"] = int(self.state["kept_probe_rollouts"]) + kept_rollouts
        self._save()
        self._emit(report.event())

    def _next_probe_index(self) -> int:
        """A fresh probe folder, also past any probe a killed process left half done."""
        used = [len(self.state["probes"])]
        for p in (self.root / "probes").glob("probe-*"):
            tail = p.name.split("-", 1)[1]
            if tail.isdigit():
                used.append(int(tail))
        return max(used) + 1

    def _probe_should_stop(self) -> bool:
        self._poll()
        return self._stop_requested()

    def _apply_keep(self, report: Any) -> list[str]:
        """Adopt what the user asked to keep from a probe; returns the sides kept."""
        kept: list[str] = []
        if "harness" in report.kept:
            if self._hp is not None:
                self._log(
                    f"probe {report.index}: the harness result is not kept during a "
                    "harness phase (pin a candidate instead)",
                    "warning",
                )
            else:
                dst = self.root / "harnesses" / f"probe-{report.index:03d}.py"
                shutil.copyfile(report.harness.artifact, dst)
                self.state["harness"] = self._rel(dst)
                self.state["kept_harness_rollouts"] = (
                    int(self.state["kept_harness_rollouts"]) + report.harness.rollouts
                )
                kept.append("harness")
                self._log(f"probe {report.index}: kept its harness as {self._rel(dst)}")
        if "weights" in report.kept and report.weight_phase is not None:
            self._adopt_weights(report)
            kept.append("weights")
            self._log(f"probe {report.index}: kept its weights")
        self._save()
        return kept

    def _adopt_weights(self, report: Any) -> None:
        import copy

        import torch

        probe_phase = report.weight_phase
        run = self._weights()
        if run.tm is not probe_phase.tm:
            live = dict(run.tm.named_trainable())
            with torch.no_grad():
                for n, p in probe_phase.tm.named_trainable():
                    live[n].copy_(p.detach())
        run.optimizer.load_state_dict(copy.deepcopy(probe_phase.optimizer.state_dict()))
        run.sampler.load_state_dict(probe_phase.sampler.state_dict())
        run.rollouts += int(probe_phase.rollouts)
        run.updates = max(int(run.updates), int(probe_phase.updates))
        save = getattr(run, "save_resume_point", None)
        if callable(save):
            save()
        else:
            run._persist(new_weights=True)
        self.state["kept_weights"] = int(self.state["kept_weights"]) + 1
        self.state["kept_weights_at"] = {"step": int(run.step), "evals": len(run.evals)}
        folder = Path(report.folder) / "kept_weights"
        run.tm.save_pretrained(folder)
        self.state["weights_ref"] = {
            "identity": self._weights_identity(),
            "path": self._rel(folder),
        }

    def probe_now(
        self, settings: ProbeSettings | None = None, *, by: str = "cli", reason: str = ""
    ) -> ProbeResult | None:
        """Run one probe on this run outside `run()` (for `whale-lab probe`); None if stopped."""
        self._acquire_lock()
        try:
            resumed = self.state.get("status") != "new"
            self._set("starting")
            _ = self.domain
            _ = self.backend
            if self._has_weight_state():
                self._weights()
            self._emit(
                RunStarted(
                    run_id=self.store.run_id,
                    domain=self.domain.name,
                    model=self.cfg.model.path,
                    schedule=self.cfg.schedule.kind,
                    harness=self.state["harness"],
                    config=self.cfg.to_dict(),
                    resumed=resumed,
                )
            )
            args = dataclasses.asdict(settings or self.probe_settings)
            cmd = Command("probe", by=by, reason=reason, args=args)
            self._set("running")
            self._accept(cmd)
            results: list[ProbeResult] = []
            self.store.subscribe(
                lambda ev: results.append(ev) if isinstance(ev, ProbeResult) else None
            )
            if self._probe_request is not None:
                self._run_probe()
            if self.state.get("status") == "new":
                self.state["status"] = "stopped"
            self._save()
            if self.state["status"] == "completed":
                self._emit(
                    RunFinished(
                        status="completed",
                        message="probed after completion",
                        best=self.state.get("best") or {},
                    )
                )
            else:
                self._emit(
                    RunFinished(
                        status="stopped",
                        message=("probe only; `whale-lab resume` runs the schedule from here"),
                    )
                )
            self._set("finished")
            return results[-1] if results else None
        finally:
            self._close()
            self._release_lock()

    # ------------------------------------------------------------------ ledger and result
    def ledger(self) -> Ledger:
        """Rebuilt from what is persisted, so it survives any kill unchanged."""
        led = Ledger(
            weight_rollouts=self._weight_rollouts(),
            harness_rollouts=self._harness_rollouts(),
            eval_rollouts=self._weight_eval_rollouts() + int(self.state["eval_rollouts"]),
            probe_rollouts=int(self.state["probe_rollouts"]),
            kept_probe_rollouts=int(self.state["kept_probe_rollouts"]),
        )
        for rec in self.state["phases"]:
            entry = PhaseLedger(
                index=int(rec["index"]),
                kind=rec["kind"],
                cycle=int(rec["cycle"]),
                status="ended" if rec["status"] == "ended" else "running",
                reason=rec.get("reason", ""),
            )
            if rec["kind"] == "weight":
                end = rec.get("end_weight_rollouts")
                end = int(end) if end is not None else self._weight_rollouts()
                entry.weight_rollouts = end - int(rec.get("start_weight_rollouts", 0))
            else:
                archive = self._archive_state(rec)
                usage = archive.get("usage", {}) or {}
                entry.harness_rollouts = int(archive.get("rollouts", 0))
                entry.proposer_prompt_tokens = int(usage.get("prompt_tokens", 0))
                entry.proposer_completion_tokens = int(usage.get("completion_tokens", 0))
                entry.proposer_cost = float(usage.get("cost", 0.0))
                led.add_proposer(usage)
            led.phases.append(entry)
        led.add_proposer(self.state.get("probe_usage", {}))
        led.probes = Ledger.from_dict({"probes": self.state["probes"]}).probes
        return led

    def _checkpoint_info(self, key: str) -> dict[str, Any]:
        """Harness and weights of an evaluation point (engine's or the weight phase's)."""
        if not key:
            return {}
        info = self.state["checkpoints"].get(self._rel(key))
        if info:
            return {"harness": info.get("harness", ""), "weights": info.get("weights", "")}
        meta = read_json(self._abs(key) / "meta.json", None)  # a weight-phase checkpoint
        if isinstance(meta, dict):
            return {"harness": self._rel(meta.get("harness", "")), "weights": self._rel(key)}
        return {}

    def best(self) -> dict[str, Any]:
        """Val-selected checkpoint with its test score, and the best-on-test figure beside it."""
        from whale_lab.engine.report import summarise_run

        s = summarise_run(self.root)
        if not s.curve:
            return {}
        tested = [p for p in s.curve if p.test is not None]
        on_test = max(tested, key=lambda p: (p.test, -p.rollouts)) if tested else None
        info = self._checkpoint_info(s.selected_checkpoint)
        return {
            "checkpoint": self._rel(s.selected_checkpoint) if s.selected_checkpoint else "",
            "val": s.selected_val,
            "test": s.selected_test,
            "harness": info.get("harness", ""),
            "weights": info.get("weights", ""),
            "best_on_test": s.best_test,
            "best_on_test_checkpoint": self._rel(on_test.checkpoint) if on_test else "",
            "selection": SELECTION_RULE,
            "best_on_test_note": PAPER_RULE,
        }

    def _finish(self, status: str, message: str) -> None:
        best = self.best()
        self.state["status"] = status
        self.state["message"] = message
        self.state["best"] = best
        self._save()
        atomic_write_json(
            self.root / RESULT_FILE,
            {
                "status": status,
                "message": message,
                "best": best,
                "ledger": self.state["ledger"],
                "schedule": self.cfg.schedule.kind,
                "domain": self.cfg.domain.name,
                "seed": self.cfg.run.seed,
            },
        )
        self._emit(RunFinished(status=status, message=message, best=best))
        self._set("finished")

    def _finish_stopped(self) -> None:
        self._poll()
        who = f" by {self._stop_by}" if self._stop_by else ""
        self._finish(
            "stopped", f"stopped at a safe point{who}; resume with `whale-lab resume {self.root}`"
        )

    def _finish_pending(self) -> None:
        pending = [c for rec in self.state["phases"] for c in rec.get("pending", [])]
        self._finish(
            "stopped",
            f"{', '.join(pending) or 'a candidate'} awaits review; resume "
            f"with `whale-lab resume {self.root}`",
        )

    # ------------------------------------------------------------------ one engine per folder
    def _acquire_lock(self) -> None:
        path = self.root / LOCK_FILE
        data = read_json(path, None)
        if isinstance(data, dict):
            pid = int(data.get("pid", -1))
            if pid != os.getpid() and pid > 0 and _pid_alive(pid):
                raise EngineError(
                    f"run {self.root} is already open in process {pid}; close it there first"
                )
        atomic_write_json(path, {"pid": os.getpid(), "since": time.time()})

    def _release_lock(self) -> None:
        path = self.root / LOCK_FILE
        data = read_json(path, None)
        if isinstance(data, dict) and int(data.get("pid", -1)) == os.getpid():
            path.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- opening runs


def load_run_config(run_dir: str | Path) -> Config:
    """The config a run folder was started with (its `config.json`)."""
    root = Path(run_dir)
    if not root.is_dir():
        raise EngineError(f"run folder {root} not found")
    if (root / "search.json").exists():
        raise EngineError(
            f"{root} is a `whale-lab search` run; resume it with `whale-lab search --resume {root}`"
        )
    saved = read_json(root / "config.json", None)
    if not isinstance(saved, dict):
        raise EngineError(f"{root} is not a whale-lab run folder (no readable config.json)")
    try:
        return config_from_dict(saved)
    except ConfigError as exc:
        raise EngineError(f"{root / 'config.json'}: {exc}") from None


def open_engine(
    cfg: Config,
    run_dir: str | Path | None,
    *,
    reviewer: Reviewer,
    commands: CommandChannel,
    backend: Any = None,
    domain: Any = None,
    probe_settings: ProbeSettings | None = None,
) -> tuple[Engine, RunStore]:
    """A new run under `cfg.run.directory` (run_dir None), or the run in `run_dir` resumed.

    A resumed run keeps its own config.json; `cfg` only overrides the approval settings (who
    approves candidates may change between sessions, nothing else may).
    """
    if run_dir is None:
        store = RunStore.create(cfg.run.directory, cfg.run.name)
        atomic_write_json(store.root / "config.json", cfg.to_dict())
        run_cfg = cfg
    else:
        run_cfg = load_run_config(run_dir).replace(approval=cfg.approval)
        store = RunStore(run_dir)
    try:
        engine = Engine(
            run_cfg,
            store,
            reviewer=reviewer,
            commands=commands,
            backend=backend,
            domain=domain,
            probe_settings=probe_settings,
        )
    except BaseException:
        store.close()
        raise
    return engine, store


def create_run(
    cfg: Config,
    run_dir: str | Path,
    *,
    reviewer: Reviewer,
    commands: CommandChannel,
    backend: Any = None,
    domain: Any = None,
) -> tuple[Engine, RunStore]:
    """A run in a folder chosen by the caller (compare): new if it has no config.json yet."""
    root = Path(run_dir)
    if (root / "config.json").exists():
        return open_engine(
            cfg, root, reviewer=reviewer, commands=commands, backend=backend, domain=domain
        )
    store = RunStore(root)
    atomic_write_json(store.root / "config.json", cfg.to_dict())
    try:
        engine = Engine(
            cfg, store, reviewer=reviewer, commands=commands, backend=backend, domain=domain
        )
    except BaseException:
        store.close()
        raise
    return engine, store
