"""Bottleneck probes: which component limits the agent now, the weights or the harness?

A probe starts from the run's current weights and accepted harness and measures both sides on a
small budget:

* a harness probe: a few Meta-Harness iterations (auto approval) in a scratch archive under the
  probe's folder, on the current weights;
* a weight probe: a few RSFT steps on the current harness, on a copy of the trainable weights
  (the optimizer state and the sampler position are copied too), restored afterwards;

each reported as the change of val mean@k per 1,000 rollouts it spent. Trace diagnostics of the
current pair on val (format failures, tool errors, turn-cap and token-cap hits, the pass@k - mean@k
gap, retrieval recall for search, the legal-move rate for chess) say which side the failures point
at. `recommend` turns gains and diagnostics into one plain sentence and its evidence.

A probe never changes the run's accepted weights or harness unless asked to keep a result
(`keep`): the engine then adopts the kept side. Everything the probe did stays under
`<run>/probes/probe-NNN/` (its archive, its weight-probe resume points, `probe.json`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from whale_lab.backends.base import Backend, SamplingParams
from whale_lab.config import Config
from whale_lab.context import RunContext
from whale_lab.domains.base import Domain
from whale_lab.engine.verdict import (  # noqa: F401 - the probe's verdict, re-exported
    ANSWER_ACCURACY_LOW,
    ANSWERED_HIGH,
    CONTEXT_OVERFLOW_HIGH,
    FORMAT_FAILURE_HIGH,
    GAIN_EPS,
    GAP_HIGH,
    LEGAL_MOVE_LOW,
    RECALL_LOW,
    TIE_SHARE,
    TOKEN_CAP_HIGH,
    TOOL_ERROR_HIGH,
    TURN_CAP_HIGH,
    Recommendation,
    Signal,
    interval_supports,
    probe_diagnostics,
    read_signals,
    recommend,
)
from whale_lab.events import (
    CandidateScored,
    EpisodeFinished,
    Event,
    Log,
    ProbeResult,
    ProposerUsage,
    WeightStep,
)
from whale_lab.paired import MIN_TASKS, paired_difference, scores_by_task
from whale_lab.store import RunStore, atomic_write_json
from whale_lab.trace import EpisodeTrace

KeepMode = Literal["none", "weights", "harness", "both", "best"]
KEEP_MODES: tuple[str, ...] = ("none", "weights", "harness", "both", "best")

# Seed of the val evaluations (the same as the run's evaluations: common random numbers).
_VAL_SEED_TAG = 1_000_003
# Probe weight steps are numbered far above the run's, so adapters they serve never replace the
# run's own (`step-N`) on a server.
STEP_OFFSET = 1_000_000


class ProbeStopped(RuntimeError):
    """A stop request arrived mid-probe; the probe was abandoned and the run left as it was."""


def mix_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (the same mixing as the weight phase's evaluations)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % (2**31 - 1)


def val_params(cfg: Config, split_index: int = 0) -> SamplingParams:
    """Sampling for val/test evaluations: the config's sampling with the evaluation seed."""
    s = cfg.sampling
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        max_new_tokens=s.max_new_tokens,
        seed=mix_seed(cfg.run.seed, _VAL_SEED_TAG, split_index),
    )


# ---------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class ProbeSettings:
    """How much each side of a probe may spend; `keep` says which result the run adopts."""

    harness_iterations: int = 3  # the incoming harness re-scored, then 2 proposer iterations
    weight_steps: int = 3
    # one of KEEP_MODES; "best" keeps the side whose paired gain interval excludes zero (both:
    # the one with the higher low end), else the incumbent
    keep: str = "none"
    harness: bool = True
    weights: bool = True

    @classmethod
    def from_args(
        cls, args: dict[str, Any] | None, base: ProbeSettings | None = None
    ) -> ProbeSettings:
        """Settings from a probe command's args (keep, harness_iterations, weight_steps)."""
        out = base or cls()
        if not args:
            return out
        changes: dict[str, Any] = {}
        keep = args.get("keep")
        if keep is not None:
            if keep is True:
                keep = "best"
            elif keep is False:
                keep = "none"
            if keep not in KEEP_MODES:
                raise ValueError(
                    f"probe keep: expected one of {', '.join(KEEP_MODES)}, got {keep!r}"
                )
            changes["keep"] = keep
        for key in ("harness_iterations", "weight_steps"):
            if key in args:
                value = args[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"probe {key}: expected an integer >= 1, got {value!r}")
                changes[key] = value
        for key in ("harness", "weights"):
            if key in args:
                changes[key] = bool(args[key])
        return dataclasses.replace(out, **changes)


@dataclass
class SideResult:
    side: str
    ran: bool = False
    val_after: float | None = None
    rollouts: int = 0  # training rollouts of this side (the denominator of the gain)
    eval_rollouts: int = 0
    gain_per_1k: float | None = None
    note: str = ""
    error: str = ""
    artifact: str = ""  # harness: the accepted candidate; weights: the probe's resume folder
    usage: dict[str, float] = field(default_factory=dict)
    # the paired val comparison after vs before (same tasks, same seeds) and the gain's interval
    paired: dict[str, Any] | None = None
    interval: tuple[float, float] | None = None
    verdict: str = "not run"  # "gain" | "loss" | "inconclusive" | "unchanged" | "not run"
    n_tasks: int = 0  # the paired val tasks behind the interval
    wins: int = 0  # of those, the tasks whose val mean rose (they back a gain)
    losses: int = 0  # and those whose val mean fell (they back a loss)
    # where inconclusive: the paired val tasks (and tasks x k rollouts per arm) that would resolve
    # the observed change at 80% power; None where no size would (no change) or none is needed
    needed_tasks: int | None = None
    needed_rollouts: int | None = None

    @property
    def supported(self) -> bool:
        """Its gain interval's low end is above zero and at least MIN_TASKS val tasks rose."""
        return self.ran and interval_supports(self.interval, self.wins)


@dataclass
class ProbeReport:
    index: int
    folder: str
    harness_path: str
    k: int
    val_before: float
    pass_before: float
    diagnostics: dict[str, float]
    harness: SideResult
    weights: SideResult
    recommendation: Recommendation
    keep: str
    kept: tuple[str, ...] = ()
    keep_note: str = ""  # `keep best`: which side was kept and why (or why the incumbent stays)
    seconds: float = 0.0
    eval_rollouts: int = 0
    weight_phase: Any = None  # the probe's RsftPhase when its weights are to be kept

    @property
    def rollouts(self) -> int:
        return self.eval_rollouts + self.harness.rollouts + self.weights.rollouts

    def event(self) -> ProbeResult:
        diag = {
            k: float(v)
            for k, v in self.diagnostics.items()
            if isinstance(v, (int, float)) and math.isfinite(float(v))
        }
        diag["val_mean_at_k_before"] = self.val_before
        if self.harness.val_after is not None:
            diag["val_mean_at_k_after_harness_probe"] = self.harness.val_after
        if self.weights.val_after is not None:
            diag["val_mean_at_k_after_weight_probe"] = self.weights.val_after
        diag["harness_probe_rollouts"] = float(self.harness.rollouts)
        diag["weight_probe_rollouts"] = float(self.weights.rollouts)
        return ProbeResult(
            harness_gain_per_1k=self.harness.gain_per_1k or 0.0,
            weight_gain_per_1k=self.weights.gain_per_1k or 0.0,
            recommendation=self.recommendation.text,
            evidence=self.recommendation.evidence + ((self.keep_note,) if self.keep_note else ()),
            diagnostics=diag,
            verdict=self.recommendation.side,
            sides={s.side: _side_summary(s) for s in (self.harness, self.weights)},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "folder": self.folder,
            "harness": self.harness_path,
            "k": self.k,
            "val_before": self.val_before,
            "pass_before": self.pass_before,
            "diagnostics": self.diagnostics,
            "harness_probe": dataclasses.asdict(self.harness),
            "weight_probe": dataclasses.asdict(self.weights),
            "recommendation": dataclasses.asdict(self.recommendation),
            "keep": self.keep,
            "kept": list(self.kept),
            "keep_note": self.keep_note,
            "seconds": round(self.seconds, 3),
            "eval_rollouts": self.eval_rollouts,
            "rollouts": self.rollouts,
        }


def _side_summary(s: SideResult) -> dict[str, Any]:
    return {
        "ran": s.ran,
        "gain_per_1k": s.gain_per_1k,
        "interval": list(s.interval) if s.interval is not None else None,
        "verdict": s.verdict,
        "n_tasks": s.n_tasks,
        "wins": s.wins,
        "losses": s.losses,
        "needed_tasks": s.needed_tasks,
        "needed_rollouts": s.needed_rollouts,
        "rollouts": s.rollouts,
        "eval_rollouts": s.eval_rollouts,
        "val_after": s.val_after,
        "paired": s.paired,
        "note": s.error or s.note,
    }


KEEP_NOTE_PREFIX = "keep best: "


def keep_best(harness: SideResult, weights: SideResult) -> tuple[str | None, str]:
    """Which side `--keep best` keeps, and the sentence that says why. Intervals decide, never
    point estimates: a side is kept only when its paired gain interval excludes zero with at least
    MIN_TASKS val tasks up (both: the higher low end, the surer gain per rollout); otherwise the
    incumbent weights and harness stay."""
    backed = [s for s in (harness, weights) if s.supported]
    if not backed:
        return None, (
            f"{KEEP_NOTE_PREFIX}kept the incumbent weights and harness: neither side's paired "
            f"gain interval excludes zero with at least {MIN_TASKS} val tasks up "
            f"(harness {_interval_words(harness)}, weights {_interval_words(weights)})"
        )
    chosen = max(backed, key=lambda s: s.interval[0] if s.interval else -math.inf)
    other = weights if chosen is harness else harness
    why = (
        "its interval excludes zero and the other's does not"
        if len(backed) == 1
        else "both exclude zero; its low end is the higher"
    )
    return chosen.side, (
        f"{KEEP_NOTE_PREFIX}kept the {chosen.side}: gain {_interval_words(chosen)} per 1,000 "
        f"rollouts, {chosen.wins} of {chosen.n_tasks} paired val tasks up; {why} "
        f"({other.side} {_interval_words(other)})"
    )


def _interval_words(s: SideResult) -> str:
    if not s.ran or s.gain_per_1k is None:
        return "not measured"
    if s.interval is None:
        return f"{s.gain_per_1k:+.3f} (no interval)"
    return f"{s.gain_per_1k:+.3f} [{s.interval[0]:+.3f}, {s.interval[1]:+.3f}]"


def _needed_text(sides: list[SideResult], *, n_tasks: int, k: int) -> str:
    """How many paired val tasks, and tasks x k rollouts, would resolve the larger of the
    inconclusive changes (from the observed spread of the per-task differences)."""
    best: tuple[float, int] | None = None
    for side in sides:
        if side.verdict != "inconclusive" or side.needed_tasks is None or not side.paired:
            continue
        if best is None or abs(side.paired["diff"]) > best[0]:
            best = (abs(side.paired["diff"]), side.needed_tasks)
    if best is None:
        return ""
    diff, tasks = best
    return (
        f"About {tasks:,} paired val tasks x k = {k} ({tasks * k:,} val rollouts per arm; "
        f"{n_tasks} tasks, {n_tasks * k:,} rollouts now) would resolve a change of {diff:.3f} "
        "val mean@k (80% power, 95% level)."
    )


def judge_side(
    out: SideResult,
    baseline: list[EpisodeTrace],
    after: list[EpisodeTrace],
    *,
    k: int,
    seed: int = 0,
) -> None:
    """Fill `out`'s paired comparison of val after vs before (same tasks, same seeds): the
    gain interval per 1,000 of its rollouts, the verdict ("gain" / "loss" only when the interval
    excludes zero and at least MIN_TASKS tasks moved that way), and, where inconclusive, the size
    in tasks and in tasks x k rollouts that would resolve the observed change."""
    r = paired_difference(scores_by_task(baseline), scores_by_task(after), seed=seed)
    out.paired = r.to_dict()
    out.n_tasks, out.wins, out.losses = r.n_tasks, r.wins, r.losses
    scale = 1000.0 / max(out.rollouts, 1)
    out.interval = (r.low * scale, r.high * scale)
    if out.supported:
        out.verdict = "gain"
    elif interval_supports((-r.high, -r.low), r.losses):
        out.verdict = "loss"
    else:
        out.verdict = "inconclusive"
    out.needed_tasks = out.needed_rollouts = None
    if out.verdict == "inconclusive":
        need = r.needed_tasks()
        if need is None and r.n_tasks < MIN_TASKS and abs(r.diff) > GAIN_EPS:
            need = MIN_TASKS  # no spread to read on so few tasks: at least the minimum
        moved = r.wins if r.diff >= 0 else r.losses
        if need is not None and 0 < moved < MIN_TASKS:
            # enough tasks for MIN_TASKS of them to move at the rate observed
            need = max(need, math.ceil(r.n_tasks * MIN_TASKS / moved))
        if need is not None:
            out.needed_tasks = max(need, MIN_TASKS)
            out.needed_rollouts = out.needed_tasks * k


def _gain(before: float, after: float, rollouts: int) -> float:
    return (after - before) / max(1, rollouts) * 1000.0


def _same_code(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).read_text(encoding="utf-8") == Path(b).read_text(encoding="utf-8")
    except OSError:
        return False


def _never() -> bool:
    return False


class BottleneckProbe:
    """One probe of one run, from its current weights (`backend`, `run_weights`) and harness."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        index: int,
        harness_path: str | Path,
        run_weights: Any = None,  # the run's RsftPhase, if it has one
        settings: ProbeSettings | None = None,
        cycle: int = 0,
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.ctx = ctx
        cfg, store = ctx.cfg, ctx.store
        self.cfg: Config = cfg
        self.backend: Backend = ctx.backend
        self.domain: Domain = ctx.domain
        self.store: RunStore = store
        self.emit: Callable[[Event], None] = ctx.emit
        self.index = index
        self.harness_path = Path(harness_path)
        self.run_weights = run_weights
        self.settings = settings or ProbeSettings()
        self.cycle = cycle
        self.should_stop = should_stop or _never
        self.root = store.root / "probes" / f"probe-{index:03d}"
        self.k = cfg.sampling.k
        self.eval_rollouts = 0
        self.weight_steps: list[WeightStep] = []
        self._kept_phase: Any = None
        self._baseline: list[EpisodeTrace] = []
        self._trace_name = f"probe-{index:03d}-val"

    # ------------------------------------------------------------------ plumbing
    def _judge(self, out: SideResult, after: list[EpisodeTrace] | None) -> None:
        """The side's val change against the baseline, paired (same val tasks, same seeds), and
        its gain interval per 1,000 rollouts; `after` None: nothing changed, nothing to judge."""
        if not out.ran:
            return
        if after is None:
            out.interval, out.verdict = (0.0, 0.0), "unchanged"
            out.n_tasks = len({t.task_id for t in self._baseline})
            return
        judge_side(out, self._baseline, after, k=self.k, seed=self.index)

    def _side_emit(self, side: str, origin: Path) -> Callable[[Event], None]:
        """Events of a side's phase, as the run should see them: episodes marked `probe` (with
        trace paths relative to the run folder), proposer usage, logs; the rest stays here."""
        run_root = self.store.root

        def emit(ev: Event) -> None:
            if isinstance(ev, EpisodeFinished):
                path = ev.trace_path
                if path and origin != run_root and not Path(path).is_absolute():
                    path = (origin / path).relative_to(run_root).as_posix()
                self.emit(dataclasses.replace(ev, phase="probe", trace_path=path))
            elif isinstance(ev, ProposerUsage):
                self.emit(ev)
            elif isinstance(ev, Log):
                self.emit(dataclasses.replace(ev, message=f"probe ({side}): {ev.message}"))
            elif isinstance(ev, WeightStep):
                self.weight_steps.append(ev)
                self.emit(
                    Log(
                        level="info",
                        message=(
                            f"probe (weights): step {len(self.weight_steps)}, train reward "
                            f"{ev.train_reward:.3f}, accept rate {ev.accept_rate:.2f}"
                        ),
                    )
                )
            elif isinstance(ev, CandidateScored):
                self.emit(
                    Log(
                        level="info",
                        message=(
                            f"probe (harness): {ev.candidate_id} {ev.status}, success "
                            f"{ev.success_rate:.1%} on the harness split"
                        ),
                    )
                )

        return emit

    def _check(self) -> None:
        if self.should_stop():
            raise ProbeStopped("stop requested")

    def score_val(self, harness_path: str | Path, label: str) -> tuple[float, float, list]:
        """Val mean@k and pass@k of a harness under whatever weights the backend serves now."""
        from whale_lab.harness.host import harness_name

        tasks = list(self.domain.tasks("val"))
        sink = self.ctx.sink(
            self._trace_name,
            phase="probe",
            harness=harness_name(harness_path),
            info={"probe": self.index, "probe_side": label},
        )
        report = self.ctx.evaluator.score(
            harness_path,
            tasks,
            self.k,
            val_params(self.cfg, 0),
            on_episode=sink,
            should_stop=self.should_stop,
        )
        if report.rollouts < len(tasks) * self.k:
            raise ProbeStopped("stop requested during a val evaluation")
        self.eval_rollouts += report.rollouts
        return report.mean_at_k, report.pass_at_k, report.traces

    # ------------------------------------------------------------------ the probe
    def run(self) -> ProbeReport:
        t0 = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        keep = self.settings.keep
        self.emit(
            Log(
                level="info",
                message=(
                    f"probe {self.index}: measuring val under the current weights and harness "
                    f"({self.harness_path.name}); then {self.settings.harness_iterations} harness "
                    f"iterations and {self.settings.weight_steps} RSFT steps"
                ),
            )
        )
        val0, pass0, traces = self.score_val(self.harness_path, "baseline")
        self._baseline = list(traces)
        diag = probe_diagnostics(traces, domain=self.domain.name, k=self.k)
        self._check()
        harness = SideResult("harness")
        if self.settings.harness:
            harness = self._harness_side(val0)
        weights = SideResult("weights")
        keep_weights = False
        if self.settings.weights:
            weights, keep_weights = self._weight_side(val0, harness, keep)
        signals = read_signals(diag, self.domain.name)
        rec = recommend(
            harness.gain_per_1k if harness.ran else None,
            weights.gain_per_1k if weights.ran else None,
            signals,
            harness_note=harness.error or harness.note,
            weight_note=weights.error or weights.note,
            harness_interval=harness.interval if harness.ran else None,
            weight_interval=weights.interval if weights.ran else None,
            needed=_needed_text(
                [harness, weights], n_tasks=len({t.task_id for t in traces}), k=self.k
            ),
            harness_backing=harness.wins if harness.ran else None,
            weight_backing=weights.wins if weights.ran else None,
        )
        kept: list[str] = []
        if keep_weights:
            kept.append("weights")
        if harness.ran and self._keep_side("harness", keep, harness, weights):
            if harness.artifact and not _same_code(harness.artifact, self.harness_path):
                kept.append("harness")
        keep_note = keep_best(harness, weights)[1] if keep == "best" else ""
        report = ProbeReport(
            index=self.index,
            folder=str(self.root),
            harness_path=str(self.harness_path),
            k=self.k,
            val_before=val0,
            pass_before=pass0,
            diagnostics=diag,
            harness=harness,
            weights=weights,
            recommendation=rec,
            keep=keep,
            kept=tuple(kept),
            keep_note=keep_note,
            seconds=time.perf_counter() - t0,
            eval_rollouts=self.eval_rollouts,
            weight_phase=self._kept_phase if keep_weights else None,
        )
        atomic_write_json(self.root / "probe.json", report.to_dict())
        return report

    @staticmethod
    def _keep_side(side: str, keep: str, harness: SideResult, weights: SideResult) -> bool:
        """Whether `side` is kept: asked for by name, or `best` and its interval decides it."""
        if keep in (side, "both"):
            return True
        return keep == "best" and keep_best(harness, weights)[0] == side

    def _harness_side(self, val0: float) -> SideResult:
        """A few Meta-Harness iterations in a scratch archive (auto approval)."""
        from whale_lab.search.approval import ApprovalGate
        from whale_lab.search.meta_harness import HarnessPhase, HarnessPhaseError

        out = SideResult("harness")
        folder = self.root / "harness"
        try:
            phase = HarnessPhase(
                self.ctx.with_emit(self._side_emit("harness", self.store.root)),
                None,
                cycle=self.cycle,
                phase_dir=folder,
                gate=ApprovalGate("auto"),
            )
            result = phase.run(
                self.harness_path,
                iterations=self.settings.harness_iterations,
                should_stop=self.should_stop,
            )
        except HarnessPhaseError as exc:
            out.error = f"harness probe could not run: {exc}"
            self.emit(Log(level="warning", message=f"probe {self.index}: {out.error}"))
            return out
        if result.status != "completed":
            raise ProbeStopped("stop requested during the harness probe")
        out.rollouts = int(result.harness_rollouts)
        out.usage = dict(result.proposer_usage)
        out.artifact = result.accepted_path
        out.ran = True
        if not result.accepted_path or _same_code(result.accepted_path, self.harness_path):
            out.val_after = val0
            out.note = "no candidate beat the current harness on the harness split"
        else:
            before = self.eval_rollouts
            out.val_after, _, after = self.score_val(result.accepted_path, "harness")
            out.eval_rollouts = self.eval_rollouts - before
            out.note = f"best candidate {result.accepted_id}"
            self._judge(out, after)
        out.gain_per_1k = _gain(val0, out.val_after, out.rollouts)
        if out.paired is None:
            self._judge(out, None)
        return out

    def _weight_side(self, val0: float, harness: SideResult, keep: str) -> tuple[SideResult, bool]:
        """A few RSFT steps on a copy of the trainable weights; restored unless kept."""
        from whale_lab.weights.lora import WeightsError
        from whale_lab.weights.rsft import RsftPhase

        out = SideResult("weights")
        folder = self.root / "weights"
        scratch = RunStore(folder)
        try:
            try:
                side_ctx = dataclasses.replace(
                    self.ctx, store=scratch, emit=self._side_emit("weights", folder)
                )
                phase = RsftPhase(side_ctx, cycle=self.cycle)
            except WeightsError as exc:
                out.error = f"weight probe could not run: {exc}"
                self.emit(Log(level="warning", message=f"probe {self.index}: {out.error}"))
                return out, False
            import torch

            tm = phase.tm
            saved = {n: p.detach().clone() for n, p in tm.named_trainable()}
            adapters_before = set(getattr(self.backend, "adapters", {}) or {})
            active_before = getattr(self.backend, "active_model", None)
            run = self.run_weights
            if run is not None:
                if run.tm is not tm:  # adapter backends: a local copy; start from the run's
                    live = dict(tm.named_trainable())
                    with torch.no_grad():
                        for n, p in run.tm.named_trainable():
                            live[n].copy_(p.detach())
                phase.optimizer.load_state_dict(copy.deepcopy(run.optimizer.state_dict()))
                phase.sampler.load_state_dict(run.sampler.state_dict())
                phase.updates = run.updates
                phase.step = run.step + STEP_OFFSET
            else:
                phase.step = STEP_OFFSET
            phase.next_eval_at = math.inf  # no evaluation inside the probe's steps
            keep_now = False
            try:
                steps = self.settings.weight_steps
                result = phase.run(
                    self.harness_path,
                    epochs=None,
                    stop_when=lambda history: len(history) >= steps,
                    should_stop=self.should_stop,
                    cycle=self.cycle,
                )
                if result.reason == "stop":
                    raise ProbeStopped("stop requested during the weight probe")
                out.rollouts = int(result.rollouts)
                out.ran = True
                out.artifact = str(folder)
                updates = sum(1 for h in result.history if h.loss is not None)
                if updates == 0:
                    out.note = "no rollout was accepted, so the weights did not change"
                    out.val_after = val0
                else:
                    before = self.eval_rollouts
                    out.val_after, _, after = self.score_val(self.harness_path, "weights")
                    out.eval_rollouts = self.eval_rollouts - before
                    out.note = f"{updates} of {len(result.history)} steps updated the weights"
                    self._judge(out, after)
                out.gain_per_1k = _gain(val0, out.val_after, out.rollouts)
                if out.paired is None:
                    self._judge(out, None)
                keep_now = updates > 0 and self._keep_side("weights", keep, harness, out)
                if keep_now:
                    self._kept_phase = phase
                return out, keep_now
            finally:
                if not keep_now:
                    with torch.no_grad():
                        for n, p in tm.named_trainable():
                            p.copy_(saved[n])
                    self._restore_served(adapters_before, active_before)
        finally:
            scratch.close()

    def _restore_served(self, adapters_before: set[str], active_before: Any) -> None:
        """Adapter backends: drop the probe's adapters and serve the run's again."""
        adapters = getattr(self.backend, "adapters", None)
        if isinstance(adapters, dict):
            for name in sorted(set(adapters) - adapters_before):
                try:
                    self.backend.unload_adapter(name)  # type: ignore[attr-defined]
                except Exception as exc:  # noqa: BLE001 - a leftover adapter is harmless
                    self.emit(
                        Log(
                            level="warning",
                            message=f"probe {self.index}: could not unload {name}: {exc}",
                        )
                    )
        if hasattr(self.backend, "active_model"):
            self.backend.active_model = active_before  # type: ignore[attr-defined]
