"""The RSFT phase loop: accept rule and signals, the empty batch, evaluation, stop, resume, errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from rsft_support import ParityDomain, tiny_config, write_harness

from whale_lab.backends import make_backend
from whale_lab.backends.base import BackendError
from whale_lab.context import RunContext
from whale_lab.domains import make_domain
from whale_lab.events import CheckpointSaved, EpisodeFinished, EvalResult, WeightStep
from whale_lab.store import RunStore, read_json, read_jsonl
from whale_lab.trace import EpisodeTrace
from whale_lab.weights.lora import WeightsError, read_adapter_config
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sft import accept, build_examples

REPO = Path(__file__).resolve().parent.parent
MATH_H0 = REPO / "harnesses" / "math" / "h0.py"


def make_phase(root: Path, cfg: Any = None, domain: Any = None) -> tuple[RsftPhase, list]:
    cfg = cfg or tiny_config()
    store = RunStore(root)
    events: list = []

    def emit(event: Any) -> None:
        store.emit(event)
        events.append(event)

    phase = RsftPhase(RunContext.of(cfg, make_backend(cfg), domain or ParityDomain(), store, emit))
    return phase, events


def weights(phase: RsftPhase) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in phase.tm.named_trainable()}


def optimizer_tensors(phase: RsftPhase) -> list[torch.Tensor]:
    state = phase.optimizer.state_dict()["state"]
    return [state[k][name] for k in sorted(state) for name in ("exp_avg", "exp_avg_sq")]


def test_a_step_trains_on_exactly_the_accepted_rollouts(tmp_path: Path) -> None:
    phase, events = make_phase(tmp_path / "run")
    result = phase.run(write_harness(tmp_path), epochs=0.25)
    (step,) = [e for e in events if isinstance(e, WeightStep)]
    assert result.history == (step,)
    traces = [EpisodeTrace.from_dict(r) for r in read_jsonl(tmp_path / "run/traces/weight.jsonl")]
    rewards = [t.reward for t in traces]
    assert step.rollouts == len(traces) == 2 * 4  # prompts_per_step x samples_per_prompt
    first_two = {phase.weight_tasks[i].id for i in phase.sampler.order(0)[:2]}
    assert {t.task_id for t in traces} == first_two  # the sampler's first prompts, 4 samples each
    kept = accept(traces, 0.5)
    assert 0 < step.kept == len(kept) == sum(r > 0.5 for r in rewards) < len(traces)
    assert step.accept_rate == pytest.approx(len(kept) / len(traces))
    assert step.train_reward == pytest.approx(sum(rewards) / len(rewards))
    examples = build_examples(kept, phase.tm.tokenizer, max_length=2048)
    assert step.tokens == sum(e.n_target for e in examples) > 0
    assert step.loss is not None and step.grad_norm is not None and step.step_seconds > 0
    assert (step.cycle, step.step, step.epoch) == (0, 1, 0.25)
    finished = [e for e in events if isinstance(e, EpisodeFinished)]
    assert len(finished) == 8 and all(e.phase == "weight" for e in finished)
    assert sorted(e.trace_line for e in finished) == list(range(8))
    assert all(t.info["rsft_step"] == 1 for t in traces)


def test_no_accepted_rollout_means_no_update_but_the_step_counts(tmp_path: Path) -> None:
    """The random model never solves a math problem: every step is empty."""
    cfg = tiny_config(domain={"splits": {"weight": 4, "harness": 1, "val": 1, "test": 1}})
    phase, events = make_phase(tmp_path / "run", cfg, make_domain(cfg))
    before = weights(phase)
    result = phase.run(MATH_H0, epochs=1.0)  # 4 prompts / 2 per step = 2 steps
    steps = [e for e in events if isinstance(e, WeightStep)]
    assert [s.step for s in steps] == [1, 2] and result.steps == 2 and phase.step == 2
    for s in steps:
        assert (s.kept, s.loss, s.grad_norm, s.tokens, s.accept_rate) == (0, None, None, 0, 0.0)
        assert s.rollouts == 8 and s.train_reward == 0.0
    assert all(torch.equal(before[n], p) for n, p in phase.tm.named_trainable())
    assert phase.optimizer.state_dict()["state"] == {}
    assert phase.updates == 0 and phase.sampler.drawn == 4
    assert phase.ckpt.latest()["step"] == 2


def test_evaluations_checkpoint_and_track_the_best_by_val(tmp_path: Path) -> None:
    # every 2 prompts = every step; test at every point, not only at new bests on val
    cfg = tiny_config(rsft={"eval_every": 0.25}, eval={"test_every": "always"})
    phase, events = make_phase(tmp_path / "run", cfg)
    phase.run(write_harness(tmp_path), epochs=0.5, eval_at_start=True)
    evals = [e for e in events if isinstance(e, EvalResult)]
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [(e.split, e.n_tasks, e.k) for e in evals] == [("val", 2, 2), ("test", 2, 2)] * 3
    assert [s.step for s in saved] == [0, 1, 2] == [e.step for e in phase.evals]
    vals = [e.mean_at_k for e in evals if e.split == "val"]
    best_i = vals.index(max(vals))
    assert saved[0].best and saved[best_i].best
    best = read_json(tmp_path / "run/weights/best.json")
    assert best["step"] == best_i and best["val_mean_at_k"] == max(vals)
    for s in saved:
        assert read_adapter_config(s.path)["r"] == 8  # a usable peft adapter folder
        assert read_json(Path(s.path) / "meta.json")["step"] == s.step
    assert evals[-1].weight_rollouts == 16 and evals[-1].checkpoint == saved[-1].path


def test_a_stop_mid_rollout_discards_the_step_and_the_phase_continues(tmp_path: Path) -> None:
    phase, events = make_phase(tmp_path / "run", domain=ParityDomain(retry=True))
    harness = write_harness(tmp_path, max_turns=2)  # odd replies get a second turn
    seen = {"n": 0}

    def on_event(event: Any) -> None:
        if isinstance(event, EpisodeFinished):
            seen["n"] += 1

    phase.store.subscribe(on_event)
    # The whole first step, then stop once a second-step episode ended while others go on.
    result = phase.run(harness, epochs=0.5, should_stop=lambda: seen["n"] > 8)
    assert result.reason == "stop" and phase.step == 1 and phase.sampler.drawn == 2
    assert 8 < seen["n"] < 16  # part of the second step's rollouts ran, then were dropped
    assert phase.phase_active
    result = phase.run(harness)  # the open phase goes on with its own budget
    assert result.reason == "budget" and result.steps == 2 and phase.step == 2
    assert [h.step for h in result.history] == [1, 2]
    assert not phase.phase_active


def test_resume_restores_weights_optimizer_and_sampler_exactly(tmp_path: Path) -> None:
    harness = write_harness(tmp_path)
    phase, _ = make_phase(tmp_path / "a")
    phase.run(harness, epochs=0.5)
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the run as a kill would leave it
    w, opt, sampler = weights(phase), optimizer_tensors(phase), phase.sampler.state_dict()
    assert phase.updates >= 1 and opt

    resumed, events = make_phase(tmp_path / "b")
    assert resumed.resume()
    assert resumed.step == 2 and resumed.sampler.state_dict() == sampler
    assert all(torch.equal(w[n], p) for n, p in resumed.tm.named_trainable())
    assert all(torch.equal(a, b) for a, b in zip(opt, optimizer_tensors(resumed), strict=True))
    assert (
        resumed.optimizer.state_dict()["state"].keys()
        == phase.optimizer.state_dict()["state"].keys()
    )

    # Both go on for one more step: same prompts, same samples, same update.
    a = phase.run(harness, epochs=0.25)
    b = resumed.run(harness, epochs=0.25)
    assert a.history[0].kept == b.history[0].kept and a.history[0].loss == b.history[0].loss
    for (n, p), (_, q) in zip(
        phase.tm.named_trainable(), resumed.tm.named_trainable(), strict=True
    ):
        assert torch.allclose(p, q, atol=1e-6), n


def test_resume_after_sigkill_continues_from_the_last_completed_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "rsft_support.py"), str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "step 3" or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)  # no chance to clean up: mid-step 4 at the latest
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    latest = read_json(run / "weights/latest.json")
    assert latest is not None and latest["step"] >= 3
    phase, _ = make_phase(run)
    assert phase.resume()
    n = phase.step
    assert n == latest["step"] and phase.sampler.drawn == 2 * n
    assert phase.phase_active and len(phase._history()) == n  # the open phase came back whole
    from safetensors.torch import load_file

    saved = load_file(str(run / "weights" / latest["dir"] / "trainable.safetensors"))
    assert all(torch.equal(saved[k], p) for k, p in phase.tm.named_trainable())
    assert len(phase.optimizer.state_dict()["state"]) == len(saved)  # Adam moments restored
    result = phase.run(write_harness(run), stop_when=lambda steps: len(steps) >= n + 1)
    assert result.reason == "stop_when" and [h.step for h in result.history] == list(
        range(1, n + 2)
    )


def test_unusable_model_path_or_adapter_is_a_clear_error(tmp_path: Path) -> None:
    cfg = tiny_config(
        model={"backend": "openai", "path": str(tmp_path / "missing"), "served_model": "x"}
    )
    with pytest.raises(BackendError, match="does not exist"):
        RsftPhase(RunContext.of(cfg, make_backend(cfg), ParityDomain(), RunStore(tmp_path / "r1")))
    cfg = tiny_config()
    with pytest.raises(WeightsError, match="adapter folder .* does not exist"):
        RsftPhase(
            RunContext.of(cfg, make_backend(cfg), ParityDomain(), RunStore(tmp_path / "r2")),
            init_adapter=tmp_path / "nope",
        )
    cfg = tiny_config(model={"lora": {"target_modules": ["c_attn"]}})
    with pytest.raises(WeightsError, match="c_attn"):
        RsftPhase(RunContext.of(cfg, make_backend(cfg), ParityDomain(), RunStore(tmp_path / "r3")))


def test_full_finetuning_trains_the_served_model_itself(tmp_path: Path) -> None:
    cfg = tiny_config(rsft={"full_finetune": True, "learning_rate": 0.01})
    phase, _ = make_phase(tmp_path / "run", cfg)
    assert not phase.tm.lora and phase.tm.model is phase.backend.model  # type: ignore[attr-defined]
    embed = phase.backend.model.get_input_embeddings().weight.detach().clone()  # type: ignore[attr-defined]
    step = phase.run(write_harness(tmp_path), epochs=0.25).history[0]
    assert step.kept > 0
    assert not torch.equal(embed, phase.backend.model.get_input_embeddings().weight)  # type: ignore[attr-defined]
    folder = phase.ckpt.save_eval(phase.step, phase.tm, {"step": phase.step})
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()

    resumed, _ = make_phase(tmp_path / "run", cfg)
    assert resumed.resume()
    for (n, p), (_, q) in zip(
        phase.tm.named_trainable(), resumed.tm.named_trainable(), strict=True
    ):
        assert torch.equal(p, q), n

    # a server backend takes full weights where it can load them (vLLM's /collective_rpc);
    # one that only takes adapters refuses full fine-tuning with one line
    openai = tiny_config(
        rsft={"full_finetune": True}, model={"backend": "openai", "served_model": "x"}
    )
    served = RsftPhase(
        RunContext.of(openai, make_backend(openai), ParityDomain(), RunStore(tmp_path / "o"))
    )
    assert served.mode == "adapter" and not served.tm.lora

    class AdapterOnly:
        name = "adapter-only"

        def load_adapter(self, path: str, name: str) -> None: ...

    with pytest.raises(WeightsError, match="only take new weights as a LoRA adapter"):
        RsftPhase(RunContext.of(openai, AdapterOnly(), ParityDomain(), RunStore(tmp_path / "a")))
