"""`benchmarks/gpu_check.py`: the dry run (a tiny model on the CPU) goes through every step's code
path and every publish is verified, with vLLM absent (it says so) and with `fake_vllm` standing
in for it; on a CUDA machine the real check runs within its 8-minute budget."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import fake_vllm
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
VERIFIED = "verified"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*args: str, timeout: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def test_the_dry_run_prints_one_json_object_with_every_step_verified() -> None:
    out = _run("--dry-run", timeout=240)
    assert out["dry_run"] is True and out["device"] == "cpu"
    assert out["hf_generate"]["tokens"] > 0 and out["hf_generate"]["tok_per_s"] > 0
    assert out["hf_generate"]["scheduler"] == "continuous"  # not the padded fallback
    for step in ("lora_step", "full_step"):
        assert out[step]["loss"] is not None and out[step]["seconds"] > 0
        assert out[step]["sync"]["status"] == VERIFIED, out[step]
    assert "LoRA adapts 14 modules" in out["lora_step"]["adapted"]  # all linear layers, 2 layers
    assert out["full_step"]["trainable_params"] == out["model"]["params"]
    if importlib.util.find_spec("vllm") is None:
        assert out["vllm"]["available"] is False and "not installed" in out["vllm"]["reason"]


def test_the_dry_run_publishes_to_vllm_and_verifies_both_ways(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_vllm.install(monkeypatch)
    out = _module().run(dry_run=True)
    v = out["vllm"]
    assert v["available"] is True and v["generate"]["tokens"] > 0
    assert v["lora_swap_seconds"] > 0 and v["weight_load_seconds"] > 0
    assert v["lora_sync"]["status"] == VERIFIED, v["lora_sync"]
    assert v["full_sync"]["status"] == VERIFIED, v["full_sync"]
    engine = fake_vllm.LLM.last
    assert engine is not None
    calls = [c for c, _ in engine.record.calls]
    assert "remove_lora" in calls and "collective_rpc" in calls


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_the_gpu_check_runs_within_its_budget_on_cuda() -> None:
    out = _run(timeout=480)
    assert out["device"] == "cuda" and out["dtype"] == "bfloat16"
    assert 4e8 < out["model"]["params"] < 6e8
    assert out["hf_generate"]["batch"] == 64 and out["hf_generate"]["tok_per_s"] > 0
    assert out["hf_generate"]["scheduler"] == "continuous"  # the image's transformers included
    for step in ("lora_step", "full_step"):
        assert out[step]["sync"]["status"] == VERIFIED, out[step]
        assert out[step]["peak_memory_gb"] > 0
    if out["vllm"]["available"]:
        assert out["vllm"]["lora_sync"]["status"] == VERIFIED
        assert out["vllm"]["full_sync"]["status"] == VERIFIED
    assert out["total_seconds"] < 480


def test_the_exit_status_says_whether_every_publish_was_verified() -> None:
    healthy = _module().healthy
    ok = {"status": VERIFIED}
    out = {"lora_step": {"sync": ok}, "full_step": {"sync": ok}, "vllm": {"available": False}}
    assert healthy(out)
    assert not healthy({**out, "full_step": {"sync": {"status": "mismatch", "error": "stale"}}})
    assert not healthy({**out, "vllm": {"available": True, "error": "vLLM did not start: oom"}})
    with_vllm = {"available": True, "lora_sync": ok, "full_sync": {"status": "unverified"}}
    assert not healthy({**out, "vllm": with_vllm})


def test_the_generation_arms_dry_run_compares_the_scheduler_with_plain_generate() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hf_generate_arms.py"),
                           "--dry-run"], capture_output=True, text=True, timeout=240, env=env,
                          cwd=ROOT)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["scheduler"] == "continuous"
    arms = ("continuous_first", "continuous", "continuous_no_prefix_cache", "padded",
            "plain_model_generate")  # fmt: skip
    for arm in arms:
        assert out[arm]["tokens"] > 0 and out[arm]["tok_per_s"] > 0, arm
    ratio = out["continuous"]["tok_per_s"] / out["plain_model_generate"]["tok_per_s"]
    assert out["continuous_vs_plain"] == round(ratio, 2)
