"""The weight phase of WHALE: online rejection-sampling fine-tuning, on-policy, resumable.

One step: the next `prompts_per_step` tasks of the `weight` split from the persistent sampler,
`samples_per_prompt` rollouts each under the current harness with the current weights, keep the
rollouts whose reward is above `accept_threshold`, one SFT pass over their turns, and make the new
weights serve the very next rollouts:

* `hf` backend: the backend's own model object is trained in place (LoRA injected into it), so
  the next `generate` call reads the new weights with no copy, reload or sync.
* adapter backends (`openai` against vLLM, or any backend with `load_adapter(path, name)`):
  a local copy of the base model is trained, the adapter is saved after each update and loaded
  into the server as `step-<n>` before the next rollouts.
* full fine-tuning on a backend with `load_weights(path)` (in-process vLLM): a local copy is
  trained in full and its weights are written to one safetensors file and loaded into the
  serving engine after each update. Backends with `training_window()` (vLLM's sleep mode, hf freeing its kept rows) give
  the SFT pass their memory while it runs.

After every publish the backend's greedy log-probabilities on a few probe prompts are checked
against the trainer's new and previous weights (`weights/sync.py`): a backend that does not
generate with the new weights stops the run; each `weight_step` records the outcome, and the
phase counts the outcomes for the run's ledger.

SFT trains on the token ids each rollout sampled. Over a vLLM server the openai backend gets them
back only with log-probabilities, so RSFT rollouts (not evaluations) ask for those there.

After every completed step a resume point (weights, optimizer state, sampler position, phase
state) is written, so a run killed at any moment resumes from its last completed step.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.backends.base import Backend, BackendError, SamplingParams
from whale_lab.config import Config
from whale_lab.context import EpisodeSink, RunContext
from whale_lab.domains.base import Domain, Task
from whale_lab.events import (
    CheckpointSaved,
    EvalResult,
    Event,
    Log,
    PhaseProgress,
    WeightStep,
)
from whale_lab.metrics import reaches_best
from whale_lab.store import RunStore, read_jsonl
from whale_lab.trace import EpisodeTrace
from whale_lab.weights.checkpoint import Checkpointer
from whale_lab.weights.lora import (
    ALL_LINEAR,
    TrainableModel,
    WeightsError,
    adapted_summary,
    attach,
    load_adapter_weights,
)
from whale_lab.weights.resume import EvalRecord, ResumablePhase
from whale_lab.weights.sampler import PromptSampler
from whale_lab.weights.sft import (
    SftStats,
    accept,
    build_examples,
    enable_checkpointing,
    end_token_id,
    sft_pass,
)
from whale_lab.weights.sync import SKIPPED, UNVERIFIED, VERIFIED, SyncResult, WeightSync

StopWhen = Callable[[Sequence[WeightStep]], bool]
SYNC_OUTCOMES = (VERIFIED, UNVERIFIED, SKIPPED)  # what a recorded weight_step's sync can be


def trains_in_place(backend: Any) -> bool:
    """Whether RSFT trains the backend's own model object (hf), rather than a copy whose weights
    it publishes to the backend (adapters, or full weights): callers preflight the publishing
    endpoint before any rollout only in the second case."""
    model, tokenizer = getattr(backend, "model", None), getattr(backend, "tokenizer", None)
    return model is not None and tokenizer is not None


def ids_need_logprobs(backend: Any) -> bool:
    """Whether RSFT rollouts must ask for log-probabilities to get the sampled token ids back.

    The openai backend asks a vLLM server for its tokens as "token_id:N" only together with
    `logprobs` (there is no request for ids alone), so without them SFT re-encodes the reply
    text. The cost is the sampled token's log-probability in each answer. Only vLLM-kind
    servers: `transformers serve` returns neither, other servers may refuse the fields. The
    server's kind is known after preflight; an unchecked backend is preflighted here, as its
    first generation would do anyway.
    """
    from whale_lab.backends.openai import OpenAIBackend
    from whale_lab.backends.openai_pool import EndpointPool

    endpoints = backend.endpoints if isinstance(backend, EndpointPool) else [backend]
    if not endpoints or not all(isinstance(e, OpenAIBackend) for e in endpoints):
        return False
    for e in endpoints:
        if e.verify and not e.preflighted:
            e.preflight()
    return any(e.server_kind == "vllm" for e in endpoints)


@dataclass(frozen=True)
class PhaseResult:
    """What one call of `RsftPhase.run` did, for the engine's schedules and ledgers."""

    reason: str  # "budget" | "stop_when" | "stop"
    steps: int  # steps completed in this phase (across a resume)
    first_step: int  # global step counter when the phase began
    last_step: int  # global step counter now
    epochs: float  # epochs of the weight split consumed in this phase
    rollouts: int  # weight rollouts in this phase
    kept: int
    mean_train_reward: float | None
    history: tuple[WeightStep, ...]
    best_val: float | None = None
    best_checkpoint: str = ""


def _mix_seed(*parts: int) -> int:
    """A stable 31-bit seed from integers (sampling seeds per step are reproducible on resume)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p & 0xFFFFFFFFFFFF)) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % (2**31 - 1)


class RsftPhase(ResumablePhase):
    """Online RSFT over one run; `run` is called once per weight phase and can be resumed."""

    def __init__(
        self,
        ctx: RunContext,
        *,
        cycle: int = 0,
        init_adapter: str | Path | None = None,
    ) -> None:
        self.ctx = ctx
        cfg, domain, store = ctx.cfg, ctx.domain, ctx.store
        self.cfg: Config = cfg
        self.backend: Backend = ctx.backend
        self.domain: Domain = domain
        self.store: RunStore = store
        self.emit: Callable[[Event], None] = ctx.emit
        self.evaluator = ctx.evaluator
        self.cycle = cycle
        self.harness_rollouts = 0  # set by the engine, reported beside evaluations
        self.weight_tasks: list[Task] = list(domain.tasks("weight"))
        self.sampler = PromptSampler([t.id for t in self.weight_tasks], seed=cfg.run.seed)
        # "in_place": the backend generates with the very model trained here; "adapter": a
        # training copy whose weights are published to the backend (an adapter, or in full)
        self.tm, self.mode = self._trainable()
        if cfg.rsft.gradient_checkpointing:
            enable_checkpointing(self.tm)
        if self.tm.lora and cfg.model.lora.target_modules in (ALL_LINEAR, (ALL_LINEAR,)):
            self.emit(Log(level="info", message=adapted_summary(self.tm)))
        self.eos_id = end_token_id(self.tm.tokenizer, self.tm.base)
        pad = self.tm.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_id)
        import torch

        self.optimizer = torch.optim.AdamW(
            self.tm.parameters(),
            lr=cfg.rsft.learning_rate,
            weight_decay=cfg.rsft.weight_decay,
        )
        self.ckpt = Checkpointer(store.root / "weights")
        # the phase state (plain JSON; saved with every resume point)
        self.step = 0
        self.rollouts = 0
        self.eval_rollouts = 0
        self.updates = 0  # steps that changed the weights
        self.next_eval_at = self._eval_interval()
        self.best: dict[str, Any] | None = None
        self.evals: list[EvalRecord] = []
        self._phase: dict[str, Any] | None = None
        self._resume_dir: str | None = None
        self.init_adapter = str(init_adapter) if init_adapter else ""
        if init_adapter:
            load_adapter_weights(self.tm, init_adapter)
            self.updates = 1
        self._served: str | None = None  # adapter name the server currently generates with
        self.last_publish_seconds = 0.0
        self.last_sft: SftStats | None = None
        encode = getattr(self.backend, "encode_chat", None) if self.mode == "in_place" else None
        self.template_kwargs = dict(cfg.sampling.chat_template_kwargs)
        self.sync = WeightSync(self.tm, encode=encode, template_kwargs=self.template_kwargs)
        self.last_sync: SyncResult | None = None
        self.served_version = self._version_now()
        self._noted: set[str] = set()  # notes (unverified sync, re-encoded turns) already logged
        # weight steps by sync outcome, and the last one's (the run's ledger reports them)
        self.sync_counts: dict[str, int] = dict.fromkeys(SYNC_OUTCOMES, 0)
        self.last_step_sync = ""

    # ------------------------------------------------------------------ setup
    def _trainable(self) -> tuple[TrainableModel, str]:
        be: Any = self.backend
        if trains_in_place(be):
            return attach(be.model, be.tokenizer, self.cfg), "in_place"
        full = self.cfg.rsft.full_finetune or not self.cfg.model.lora.enabled
        takes_weights = callable(getattr(be, "load_weights", None))
        if callable(getattr(be, "load_adapter", None)) or (full and takes_weights):
            if full and not takes_weights:
                raise WeightsError(
                    f"rsft.full_finetune with the {getattr(be, 'name', '?')} backend: it can "
                    "only take new weights as a LoRA adapter; use LoRA (model.lora.enabled = "
                    "true), the vllm backend (in process) or the hf backend"
                )
            from whale_lab.devices import resolve_device
            from whale_lab.models import load_model_and_tokenizer

            device = resolve_device(self.cfg.model.device)  # checked before a long load
            try:
                model, tok = load_model_and_tokenizer(
                    self.cfg.model.path, dtype=self.cfg.model.dtype, device=device
                )
            except BackendError:
                raise
            except Exception as exc:  # noqa: BLE001 - corrupt files surface as many types
                raise WeightsError(
                    f"model.path {self.cfg.model.path!r}: cannot load the weights to train: {exc}"
                ) from None
            return attach(model, tok, self.cfg), "adapter"
        raise WeightsError(
            f"the {getattr(be, 'name', type(be).__name__)} backend cannot serve trained weights: "
            "it exposes neither its model (hf) nor load_adapter (openai/vLLM)"
        )

    def _version_now(self) -> str:
        """What the backend serves before any publish of this object: the base model, or the
        weights this phase holds (resumed, adopted or given) under the step they belong to."""
        return "base" if self.updates == 0 else f"step-{self.step}"

    def _eval_interval(self) -> float:
        """Prompts between evaluations (eval_every is a fraction of an epoch)."""
        return max(1.0, self.cfg.rsft.eval_every * len(self.weight_tasks))

    @property
    def epoch(self) -> float:
        return self.sampler.epochs_done

    def steps_for(self, epochs: float) -> int:
        """Steps that make up `epochs` epochs of the weight split (at least one)."""
        return max(1, round(epochs * len(self.weight_tasks) / self.cfg.rsft.prompts_per_step))

    # ------------------------------------------------------------------ harness host
    def _open_host(self, harness_path: str | Path) -> Any:
        return self.evaluator.host(harness_path)

    # ------------------------------------------------------------------ the phase
    def run(
        self,
        harness_path: str | Path,
        epochs: float | None = None,
        stop_when: StopWhen | None = None,
        should_stop: Callable[[], bool] | None = None,
        *,
        cycle: int | None = None,
        eval_at_start: bool = False,
        final_eval: bool = False,
    ) -> PhaseResult:
        """Train under `harness_path` until the budget is spent, `stop_when(steps)` says so, or
        `should_stop()` turns true. A phase interrupted by `should_stop` (or a kill) continues
        where it was on the next call; `end_phase()` drops it instead.

        `epochs` is the phase budget (steps = epochs x |weight split| / prompts_per_step);
        `stop_when` receives this phase's WeightStep events after every step (adaptive schedule).
        """
        if epochs is None and stop_when is None and self._phase is None:
            raise ValueError("RsftPhase.run needs a budget: epochs, stop_when or both")
        if cycle is not None:
            self.cycle = cycle
        if self._phase is None:
            self._phase = {
                "start_step": self.step,
                "start_drawn": self.sampler.drawn,
                "target_steps": None if epochs is None else self.steps_for(epochs),
                "epochs": epochs,
                "harness": str(harness_path),
                "history": [],
            }
        phase = self._phase
        host = self._open_host(harness_path)
        name = str(getattr(host.info, "name", Path(harness_path).stem))
        reason = "stop"
        try:
            self.publish(initial=True)
            if eval_at_start and not self.evals and self.step == 0:
                if self._evaluate(harness_path, name, host, should_stop) is None:
                    return self._result(reason)
            while True:
                if should_stop is not None and should_stop():
                    break
                if self.sampler.drawn >= self.next_eval_at:
                    if self._evaluate(harness_path, name, host, should_stop) is None:
                        break
                history = self._history()
                target = phase["target_steps"]
                if target is not None and self.step - phase["start_step"] >= target:
                    reason = "budget"
                    break
                if stop_when is not None and history and stop_when(history):
                    reason = "stop_when"
                    break
                if self._step(host, name, should_stop) is None:
                    break
            if (
                reason != "stop"
                and final_eval
                and (not self.evals or self.evals[-1].step != self.step)
            ):
                if self._evaluate(harness_path, name, host, should_stop) is None:
                    reason = "stop"
        finally:
            host.close()
        result = self._result(reason)
        if reason != "stop":
            self.end_phase()
        return result

    def state_dict(self) -> dict[str, Any]:
        """The resume point's state, with the sync outcomes of the weight steps so far."""
        state = super().state_dict()
        state["sync_counts"] = {**self.sync_counts, "last": self.last_step_sync}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        saved = state.get("sync_counts")
        saved = saved if isinstance(saved, dict) else {}  # a state from before the counts
        self.sync_counts = {k: int(saved.get(k, 0) or 0) for k in SYNC_OUTCOMES}
        self.last_step_sync = str(saved.get("last", "") or "")

    def end_phase(self) -> None:
        """Close the current phase (e.g. after a switch command) so the next run starts anew."""
        if self._phase is not None:
            self._phase = None
            self._persist()

    @property
    def phase_active(self) -> bool:
        return self._phase is not None

    def _history(self) -> list[WeightStep]:
        if self._phase is None:
            return []
        return [WeightStep(**h) for h in self._phase["history"]]

    def _result(self, reason: str) -> PhaseResult:
        phase = self._phase or {
            "start_step": self.step,
            "start_drawn": self.sampler.drawn,
            "history": [],
        }
        hist = tuple(self._history())
        rewards = [h.train_reward for h in hist]
        best = self.best or {}
        return PhaseResult(
            reason=reason,
            steps=self.step - phase["start_step"],
            first_step=phase["start_step"],
            last_step=self.step,
            epochs=(self.sampler.drawn - phase["start_drawn"]) / len(self.weight_tasks),
            rollouts=sum(h.rollouts for h in hist),
            kept=sum(h.kept for h in hist),
            mean_train_reward=sum(rewards) / len(rewards) if rewards else None,
            history=hist,
            best_val=best.get("val_mean_at_k"),
            best_checkpoint=str(best.get("path", "")),
        )

    # ------------------------------------------------------------------ one step
    def sampling_params(self, seed: int, *, training: bool = False) -> SamplingParams:
        """The configured sampling; `training` rollouts also ask for log-probabilities where
        that is the only way to get the sampled ids back (`ids_need_logprobs`): SFT trains on
        those ids, evaluations do not need them."""
        s = self.cfg.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_new_tokens=s.max_new_tokens,
            seed=seed,
            logprobs=training and ids_need_logprobs(self.backend),
        )

    def _episode_sink(
        self, trace_name: str, phase: str, harness: str, extra: dict[str, Any]
    ) -> EpisodeSink:
        return EpisodeSink.for_store(
            self.store, self.emit, trace_name, phase=phase, harness=harness, info=extra
        )

    def _step(
        self, host: Any, harness_name: str, should_stop: Callable[[], bool] | None
    ) -> WeightStep | None:
        """One RSFT step; None (and nothing counted) when stopped before its rollouts finished."""
        rs = self.cfg.rsft
        t0 = time.perf_counter()
        before = self.sampler.state_dict()
        n = self.step + 1
        tasks = [self.weight_tasks[i] for i in self.sampler.draw(rs.prompts_per_step)]
        jobs = [(t, s) for t in tasks for s in range(rs.samples_per_prompt)]
        self.tm.eval()
        sink = self._episode_sink(
            "weight", "weight", harness_name, {"rsft_step": n, "cycle": self.cycle}
        )
        traces = self.evaluator.episodes(
            jobs,
            host,
            self.sampling_params(_mix_seed(self.cfg.run.seed, n), training=True),
            on_episode=sink,
            should_stop=should_stop,
        )
        if len(traces) < len(jobs):  # stopped mid-rollout: the step never happened
            self.sampler.load_state_dict(before)
            return None
        kept = accept(traces, rs.accept_threshold)
        stats = self.update(kept, seed=_mix_seed(self.cfg.run.seed, n, 7))
        self.step = n
        self.rollouts += len(traces)
        sync: SyncResult | None = None
        if stats.minibatches - stats.skipped_nonfinite > 0:
            self.updates += 1
            sync = self.publish()
        rewards = [t.reward for t in traces]
        ev = WeightStep(
            cycle=self.cycle,
            step=n,
            epoch=round(self.epoch, 6),
            train_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            accept_rate=len(kept) / len(traces) if traces else 0.0,
            kept=len(kept),
            loss=stats.loss,
            tokens=stats.tokens,
            grad_norm=stats.grad_norm,
            step_seconds=round(time.perf_counter() - t0, 4),
            rollouts=len(traces),
            served_version=self.served_version,
            fingerprint=self.last_sync.fingerprint if self.last_sync is not None else "",
            sync=sync.status if sync is not None else SKIPPED,
            sync_distance=sync.distance if sync is not None else None,
            sync_note=sync.note if sync is not None else "",
            reencoded_turns=stats.reencoded_turns,
        )
        self.sync_counts[ev.sync] = self.sync_counts.get(ev.sync, 0) + 1
        self.last_step_sync = ev.sync
        assert self._phase is not None
        self._phase["history"].append({k: v for k, v in ev.to_dict().items() if k != "type"})
        self._persist(new_weights=True)
        self.emit(ev)
        phase = self._phase
        budget = phase["epochs"] if phase["epochs"] is not None else 0.0
        self.emit(
            PhaseProgress(
                cycle=self.cycle,
                phase="weight",
                done=(self.sampler.drawn - phase["start_drawn"]) / len(self.weight_tasks),
                budget=float(budget),
            )
        )
        return ev

    def update(self, kept: Sequence[EpisodeTrace], *, seed: int = 0) -> SftStats:
        """One SFT pass over the turns of accepted traces; no examples means no update."""
        encode = getattr(self.backend, "encode_chat", None) if self.mode == "in_place" else None
        examples = build_examples(
            kept,
            self.tm.tokenizer,
            eos_id=self.eos_id,
            max_length=self.cfg.model.max_context_tokens,
            encode=encode,
            template_kwargs=self.template_kwargs,
        )
        if examples:
            self.sync.remember()  # what the backend serves until the publish after this update
        window = getattr(self.backend, "training_window", None)
        with window() if examples and callable(window) else contextlib.nullcontext():
            if self.cfg.rsft.launcher == "accelerate":
                from whale_lab.weights.distributed import DistributedTrainer

                trainer = DistributedTrainer(self.cfg, self.ckpt.root / "dist-job")
                stats = trainer.pass_(self.tm, self.optimizer, examples, seed=seed)
            else:
                stats = sft_pass(
                    self.tm.model,
                    self.optimizer,
                    examples,
                    minibatch_size=self.cfg.rsft.minibatch_size,
                    max_grad_norm=self.cfg.rsft.max_grad_norm,
                    pad_id=self.pad_id,
                    params=self.tm.parameters(),
                    seed=seed,
                    minibatch_unit=self.cfg.rsft.minibatch_unit,
                )
        self.tm.eval()
        self.last_sft = stats
        if stats.reencoded_turns:
            self._note(
                f"weight step {self.step + 1}: {stats.reencoded_turns} of {stats.examples} trained "
                f"turns were re-encoded from their text: the {getattr(self.backend, 'name', '?')} "
                "backend returned no sampled token ids",
                key="reencoded",
            )
        return stats

    # ------------------------------------------------------------------ serving new weights
    def publish(self, initial: bool = False) -> SyncResult | None:
        """Make the current weights the ones the backend generates with (adapter backends), then
        check that it does (`WeightSyncError` if not); the check's result, None when nothing was
        published. `initial`: serve weights this object already holds (resumed, given) once."""
        if self.mode == "in_place":
            self.last_publish_seconds = 0.0  # in place: the backend already holds these weights
            if initial:
                return None
            self.served_version = f"step-{self.step}"
            return self._verify(adapter="", baseline=False)
        if initial and (self._served is not None or self.updates == 0):
            return None
        t0 = time.perf_counter()
        name = f"step-{self.step}"  # a name the server already holds is replaced by the backend
        if not self.tm.lora:  # a separate serving copy that takes the full weights
            path = self.ckpt.save_served_weights(self.step, self.tm)
            self.backend.load_weights(str(path))  # type: ignore[attr-defined]
        else:
            path = self.ckpt.save_served(self.step, self.tm)
            self.backend.load_adapter(str(path), name=name)  # type: ignore[attr-defined]
        self._served = name
        self.served_version = name
        self.last_publish_seconds = time.perf_counter() - t0
        # a first publish replaces what a fresh server starts with: the base model
        if not self.tm.lora:
            result = self._verify(adapter="", baseline=initial, label=f"full weights {name}")
        else:
            result = self._verify(adapter=name, baseline=initial)
        if initial:  # no weight_step carries this check: say it here
            self.emit(
                Log(
                    level="info",
                    message=f"weights {name} published to the {getattr(self.backend, 'name', '?')} "
                    f"backend: sync {result.status}" + (f" ({result.note})" if result.note else ""),
                )
            )
        return result

    def _verify(self, *, adapter: str, baseline: bool, label: str = "") -> SyncResult:
        result = self.sync.check(
            self.backend,
            served_version=self.served_version,
            adapter=adapter,
            baseline=baseline,
            label=label,
        )
        self.last_sync = result
        if result.status == UNVERIFIED:
            self._note(
                f"weight sync unverified for {self.served_version} on the "
                f"{getattr(self.backend, 'name', '?')} backend: {result.note}",
                key="sync:" + " ".join(result.note.split()[:4]),  # the kind, not its numbers
            )
        return result

    def _note(self, message: str, *, key: str) -> None:
        """A log line the first time a kind of note comes up in this phase object, not each step."""
        if key in self._noted:
            return
        self._noted.add(key)
        self.emit(Log(level="warning", message=message))

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self, harness_path: str | Path, should_stop: Callable[[], bool] | None = None
    ) -> EvalRecord | None:
        """Evaluate now (outside `run`): val, and test where `eval.test_every` asks for it, with
        a checkpoint and best tracking."""
        host = self._open_host(harness_path)
        try:
            self.publish(initial=True)
            name = str(getattr(host.info, "name", Path(harness_path).stem))
            return self._evaluate(harness_path, name, host, should_stop)
        finally:
            host.close()

    def _best_val_so_far(self) -> float | None:
        """The run's best val mean@k before this evaluation: this phase's evaluations from its
        own (resumable) state, every other point's from the run's events (the engine's start
        and phase-end points). A result of this phase in the events but not in its state was
        written by a process killed before it saved the evaluation, and does not count."""
        vals = [e.val for e in self.evals]
        own = (self.ckpt.root / "checkpoints").resolve()
        for rec in read_jsonl(self.store.root / "events.jsonl"):
            if rec.get("type") != EvalResult.type or rec.get("split") != "val":
                continue
            value = rec.get("mean_at_k")
            where = str(rec.get("checkpoint") or "")
            if where and Path(where).resolve().parent == own:
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                vals.append(float(value))
        return max(vals, default=None)

    def _evaluate(
        self,
        harness_path: str | Path,
        harness_name: str,
        host: Any,
        should_stop: Callable[[], bool] | None,
    ) -> EvalRecord | None:
        """Val always; test too under `eval.test_every = "always"`, else only where val is a new
        best of the run or ties it (`metrics.reaches_best`: test only feeds the report, and the
        selected point, a tie broken by the paired val tie-break included, always has it)."""
        self.tm.eval()
        k = self.cfg.sampling.k
        always = self.cfg.eval.test_every == "always"
        floor = None if always else self._best_val_so_far()
        splits = [
            (
                split,
                self.domain.tasks(split),  # type: ignore[arg-type]
                self.sampling_params(_mix_seed(self.cfg.run.seed, 1_000_003, i)),
            )
            for i, split in enumerate(("val", "test"))
        ]
        info = {"rsft_step": self.step, "cycle": self.cycle}
        reports = self.evaluator.score_splits(
            harness_path,
            splits,
            k,
            sink=lambda split: self._episode_sink(f"eval-{split}", "eval", harness_name, info),
            wanted=lambda split, done: (
                split == "val" or floor is None or reaches_best(done["val"].mean_at_k, floor)
            ),
            should_stop=should_stop,
            host=host,
        )
        sizes = {split: len(tasks) * k for split, tasks, _ in splits}
        for split, rep in reports.items():
            if rep.rollouts < sizes[split]:
                return None  # stopped: an evaluation on part of a split is not a score
            self.eval_rollouts += rep.rollouts
        val, test = reports["val"], reports.get("test")
        meta = {
            "step": self.step,
            "epoch": self.epoch,
            "cycle": self.cycle,
            "harness": str(harness_path),
            "val_mean_at_k": val.mean_at_k,
            "test_mean_at_k": test.mean_at_k if test is not None else None,
            "k": k,
        }
        path = self.ckpt.save_eval(self.step, self.tm, meta)
        is_best = self.best is None or val.mean_at_k > float(self.best["val_mean_at_k"])
        for split, rep in reports.items():
            self.emit(
                EvalResult(
                    split=split,
                    cycle=self.cycle,
                    phase="weight",
                    mean_at_k=rep.mean_at_k,
                    pass_at_k=rep.pass_at_k,
                    k=k,
                    n_tasks=rep.n_tasks,
                    harness=harness_name,
                    checkpoint=str(path),
                    weight_rollouts=self.rollouts,
                    harness_rollouts=self.harness_rollouts,
                    diagnostics={
                        key: float(v)
                        for key, v in rep.diagnostics.items()
                        if isinstance(v, (int, float)) and math.isfinite(float(v))
                    },
                )
            )
        if is_best:
            self.best = {
                "step": self.step,
                "epoch": self.epoch,
                "path": str(path),
                "val_mean_at_k": val.mean_at_k,
                "test_mean_at_k": meta["test_mean_at_k"],
                "harness": str(harness_path),
                "cycle": self.cycle,
            }
            self.ckpt.write_best(self.best)
        self.emit(
            CheckpointSaved(
                path=str(path), step=self.step, val_mean_at_k=val.mean_at_k, best=is_best
            )
        )
        rec = EvalRecord(
            step=self.step,
            epoch=self.epoch,
            val=val.mean_at_k,
            test=meta["test_mean_at_k"],
            checkpoint=str(path),
            harness=str(harness_path),
        )
        self.evals.append(rec)
        interval = self._eval_interval()
        while self.next_eval_at <= self.sampler.drawn:
            self.next_eval_at += interval
        self._persist()
        return rec
