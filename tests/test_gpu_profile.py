"""`whale.gpu.toml`, the documented GPU start, checked on a CPU: every key is understood and the
values are the GPU box's, and the same file runs a tiny weight phase once the model is swapped
for the micro model and the backend for `hf` (everything else, "all-linear" LoRA targets, the
chat template variables and gradient checkpointing included, as the file has it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale_lab.cli import main
from whale_lab.config import load_config

ROOT = Path(__file__).resolve().parent.parent
GPU = ROOT / "whale.gpu.toml"

SWAP = (
    "model.path=micro",
    "model.backend=hf",
    "model.device=cpu",
    "model.dtype=float32",
    "model.max_context_tokens=2048",
)
TINY = (
    "domain.splits.weight=4",
    "domain.splits.val=4",
    "domain.splits.test=4",
    "domain.splits.harness=4",
    "sampling.max_new_tokens=24",
    "sampling.k=2",
    "rsft.prompts_per_step=2",
    "rsft.samples_per_prompt=4",
    "rsft.eval_every=1.0",
    "rsft.epochs=0.5",
)


def test_the_gpu_profile_loads_with_the_gpu_settings() -> None:
    cfg = load_config(GPU)  # strict: an unknown key or a wrong type would raise here
    m = cfg.model
    assert (m.backend, m.dtype, m.device) == ("vllm", "bfloat16", "cuda")
    assert m.max_context_tokens >= 8192 and cfg.sampling.max_new_tokens <= m.max_context_tokens
    assert m.lora.target_modules == "all-linear"
    assert 0 < m.vllm.gpu_memory_utilization < 1 and m.vllm.enable_sleep_mode
    assert cfg.sampling.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.rsft.gradient_checkpointing
    text = GPU.read_text(encoding="utf-8")
    for paper in ("1e-7", "256", "minibatch 64"):  # the paper's RSFT settings, as comments
        assert paper in text


def test_the_gpu_profile_runs_a_tiny_weight_phase_on_the_micro_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--config", str(GPU), "--set", f"run.directory={json.dumps(str(tmp_path))}"]
    for item in SWAP + TINY:
        argv += ["--set", item]
    assert main([*argv, "train", "--domain", "math"]) == 0, capsys.readouterr().err[-2000:]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "weight_step"]
    assert len(steps) == 1 and steps[0]["rollouts"] == 8
    logs = [e["message"] for e in events if e["type"] == "log"]
    adapted = [m for m in logs if m.startswith("LoRA adapts")]
    assert adapted, logs  # the resolved "all-linear" targets, named at start-up
    for name in ("q_proj", "o_proj", "gate_proj", "down_proj"):
        assert name in adapted[0]
    assert "lm_head" not in adapted[0]
    saved = json.loads((run / "config.json").read_text())
    assert saved["sampling"]["chat_template_kwargs"] == {"enable_thinking": False}
