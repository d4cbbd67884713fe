"""In-process vLLM, end to end on CPU: the real backend and RSFT phase over `fake_vllm`, a
stand-in package that runs a transformers model and behaves like vLLM where bugs hide.

Each publish is checked by the served-policy check against real log-probabilities: LoRA adapters
get fresh ids and the superseded one is removed; full fine-tuning reaches the engine through
`collective_rpc` to the workers' `load_weights`; sleep mode sleeps through the SFT pass only; an
engine that ignores new weights stops the run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fake_vllm
import pytest
from rsft_support import ParityDomain, tiny_config, write_harness

from whale_lab.backends import make_backend
from whale_lab.backends.vllm import VLLMBackend
from whale_lab.context import RunContext
from whale_lab.store import RunStore
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sync import VERIFIED, WeightSyncError


@pytest.fixture(autouse=True)
def _fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    fake_vllm.install(monkeypatch)
    yield


def _phase(tmp_path: Path, tiny_model_dir: Path, **sections: Any) -> tuple[RsftPhase, Any]:
    model = {"backend": "vllm", "path": str(tiny_model_dir), **sections.pop("model", {})}
    cfg = tiny_config(model=model, **sections)
    backend = make_backend(cfg)
    assert isinstance(backend, VLLMBackend)
    phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(tmp_path / "run")))
    return phase, backend


def _steps(phase: RsftPhase, harness: Path, n: int) -> list[Any]:
    out = []
    for _ in range(n):
        out.extend(phase.run(harness, epochs=0.25).history)  # one step each
    return out


def test_lora_adapters_get_fresh_ids_and_the_superseded_one_is_removed(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    phase, backend = _phase(
        tmp_path, tiny_model_dir, model={"vllm": {"gpu_memory_utilization": 0.4}}
    )
    engine = fake_vllm.LLM.last
    assert engine is not None
    assert engine.record.init["gpu_memory_utilization"] == 0.4
    assert engine.record.init["enable_lora"] is True and engine.record.init["max_lora_rank"] == 8
    steps = [s for s in _steps(phase, write_harness(tmp_path), 3) if s.sync != "skipped"]
    assert len(steps) >= 2, "the parity domain should accept rollouts in most steps"
    assert {s.sync for s in steps} == {VERIFIED}
    ids = [req.lora_int_id for req in backend.adapters.values()]
    assert len(backend.adapters) == 1 and ids == [len(steps)]  # only the newest is registered
    removed = [arg for call, arg in engine.record.calls if call == "remove_lora"]
    assert removed == list(range(1, len(steps)))  # each superseded id, once
    assert set(engine.loras) == {len(steps)}


def test_full_finetuning_reaches_the_engine_through_collective_rpc(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    phase, backend = _phase(tmp_path, tiny_model_dir, rsft={"full_finetune": True})
    engine = fake_vllm.LLM.last
    assert engine is not None and engine.record.init["enable_lora"] is False
    assert phase.mode == "adapter" and not phase.tm.lora
    steps = [s for s in _steps(phase, write_harness(tmp_path), 2) if s.sync != "skipped"]
    assert steps and {s.sync for s in steps} == {VERIFIED}
    assert backend.weight_loads == len(steps)
    calls = [c for c, _ in engine.record.calls]
    assert calls.count("collective_rpc") == len(steps)
    # the prefix cache is dropped after every weight load (its blocks hold the old weights)
    after = [calls[i + 1] for i, c in enumerate(calls) if c == "collective_rpc"]
    assert after == ["reset_prefix_cache"] * len(steps)
    served = sorted((tmp_path / "run" / "weights" / "served").iterdir())
    assert [p.name for p in served] == [f"step-{steps[-1].step:06d}.safetensors"]
    assert os.stat(served[0]).st_mode & 0o777 == 0o644  # a server running as another user
    import torch

    trained = dict(phase.tm.base.named_parameters())
    for name, p in engine.base.named_parameters():
        assert torch.equal(p, trained[name]), name


def test_an_engine_that_ignores_new_weights_stops_the_run(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    phase, _backend = _phase(tmp_path, tiny_model_dir, rsft={"full_finetune": True})
    monkeypatch.setattr(fake_vllm._Loader, "load_weights", lambda self, weights: {"x"})
    with pytest.raises(WeightSyncError, match="previous weights|neither"):
        _steps(phase, write_harness(tmp_path), 3)


def test_sleep_mode_sleeps_through_the_sft_pass_only(tmp_path: Path, tiny_model_dir: Path) -> None:
    phase, backend = _phase(tmp_path, tiny_model_dir, model={"vllm": {"enable_sleep_mode": True}})
    engine = fake_vllm.LLM.last
    assert engine is not None and engine.record.init["enable_sleep_mode"] is True
    steps = [s for s in _steps(phase, write_harness(tmp_path), 2) if s.kept]
    calls = [c for c, _ in engine.record.calls]
    assert calls.count("sleep") == calls.count("wake_up") == backend.sleeps == len(steps) > 0
    assert ("sleep", 1) in engine.record.calls  # level 1: weights kept on the CPU
    # every sleep is followed by its wake before anything else reaches the engine
    for i, c in enumerate(calls):
        if c == "sleep":
            assert calls[i + 1] == "wake_up"


def test_chat_template_kwargs_reach_vllm_and_the_trainer(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    kwargs = {"enable_thinking": False}
    phase, backend = _phase(tmp_path, tiny_model_dir, sampling={"chat_template_kwargs": kwargs})
    engine = fake_vllm.LLM.last
    assert engine is not None
    _steps(phase, write_harness(tmp_path), 1)
    assert engine.record.template_kwargs and all(k == kwargs for k in engine.record.template_kwargs)
    assert phase.template_kwargs == kwargs and phase.sync.template_kwargs == kwargs
    assert backend.chat_template_kwargs == kwargs
