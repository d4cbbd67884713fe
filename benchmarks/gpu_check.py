"""A prepared GPU check: does this box generate, train and publish weights that really serve?

One command, no network, under 8 minutes on one H200:

    python benchmarks/gpu_check.py            # prints one JSON object
    python benchmarks/gpu_check.py --dry-run  # the same steps on a tiny model on the CPU (CI)

It builds a random-initialised Qwen3-shaped model of about 0.5B parameters (hidden 1024, 28
layers, grouped-query attention; the micro tokenizer, so nothing is downloaded), saves it to a
temporary folder and measures:

* `hf_generate`: the hf backend's sampling throughput in bf16 at batch 64 (tokens per second of
  the second call; the first, which loads kernels, beside it) and which scheduler ran;
* `lora_step` / `full_step`: an RSFT update (LoRA on all linear layers, then full fine-tuning
  of a fresh copy; the second of two passes is timed): seconds, peak GPU memory, loss, and the
  served-policy check (`weights/sync.py`) of the hf backend after the publish;
* `vllm` (only where vLLM is installed; otherwise it says so): vLLM's throughput on the same
  prompts, the LoRA swap time (load the adapter, first generation with it), and the served-policy
  check after publishing the LoRA adapter and after loading the full fine-tuned weights through
  `collective_rpc`.

It exits 0 when every publish was verified, 1 otherwise. A `sync` other than "verified" means the weights did not reach (or could not be shown to reach)
what generates; the README's "On a GPU box" says what each figure should be.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

FULL = {"hidden": 1024, "layers": 28, "intermediate": 3072, "heads": 16, "kv_heads": 8,
        "head_dim": 128, "batch": 64, "new_tokens": 128}  # fmt: skip
TINY = {"hidden": 64, "layers": 2, "intermediate": 128, "heads": 4, "kv_heads": 2,
        "head_dim": 16, "batch": 4, "new_tokens": 8}  # fmt: skip


def build_model(folder: Path, shape: dict[str, int], dtype: Any, seed: int) -> int:
    """A random Qwen3-shaped model and the micro tokenizer, saved as a model folder."""
    import torch
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

    from whale_lab.models import MICRO_DIR

    tok = AutoTokenizer.from_pretrained(MICRO_DIR)
    config = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        intermediate_size=shape["intermediate"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["kv_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(dtype)
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def _prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"Question {i}: what is {i} + {2 * i}?"}] for i in range(n)
    ]


def _peak_gb(device: str) -> float | None:
    import torch

    if device != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 3)


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()


def _checked(check: Any) -> dict[str, Any]:
    """The served-policy check's result, a mismatch (the check stops a run) included."""
    from whale_lab.weights.sync import WeightSyncError

    try:
        return _sync_dict(check())
    except WeightSyncError as exc:
        return {"status": "mismatch", "error": str(exc)}


def _sync_dict(result: Any) -> dict[str, Any]:
    return {
        "status": result.status,
        "distance": result.distance,
        "previous_distance": result.previous_distance,
        "separation": result.separation,
        "note": result.note,
    }


def _generate(backend: Any, prompts: list, params: Any, device: str) -> dict[str, Any]:
    """Tokens per second of one batched generation at steady state: the same batch is generated
    once first, since a process's first call at a batch size loads CUDA kernels and fills the
    allocator (on an H200 the first batch-64 call took four times the second); both are given."""
    import torch

    def timed() -> tuple[float, int]:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gens = backend.generate(prompts, params)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, sum(g.completion_tokens for g in gens)

    first, _ = timed()
    seconds, tokens = timed()
    out = {"batch": len(prompts), "tokens": tokens, "seconds": round(seconds, 3),
           "tok_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
           "first_call_seconds": round(first, 3)}  # fmt: skip
    scheduler = getattr(backend, "_supports_refill", None)
    if scheduler is not None:  # the hf backend: continuous batching, or padded model.generate
        out["scheduler"] = "continuous" if backend.continuous and scheduler() else "padded"
    return out


def _examples(backend: Any, prompts: list, gens: list, eos: int) -> list[Any]:
    """Every generation as an accepted turn (what RSFT trains on: the sampled ids)."""
    from whale_lab.weights.sft import IGNORE_INDEX, SftExample

    out = []
    for i, (p, g) in enumerate(zip(prompts, gens, strict=True)):
        prefix = list(backend.encode_chat(p))
        target = [*g.token_ids, eos]
        out.append(SftExample(tuple(prefix + target), tuple([IGNORE_INDEX] * len(prefix) + target),
                              f"t{i}", False, i))  # fmt: skip
    return out


def _train_step(tm: Any, examples: list, lr: float, device: str) -> tuple[Any, dict[str, Any]]:
    """Two SFT passes over the same batch; the second is the figure (the first loads the backward
    kernels and the optimizer state). Both update the weights the sync check then compares."""
    import torch

    from whale_lab.weights.sft import sft_pass

    optimizer = torch.optim.AdamW(tm.parameters(), lr=lr)
    _reset_peak(device)
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        stats = sft_pass(tm.model, optimizer, examples, minibatch_size=16, max_grad_norm=1.0,
                         pad_id=int(tm.tokenizer.pad_token_id), params=tm.parameters(),
                         minibatch_unit="trajectories")  # fmt: skip
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    tm.eval()
    return stats, {
        "seconds": round(times[1], 3),
        "first_pass_seconds": round(times[0], 3),
        "peak_memory_gb": _peak_gb(device),
        "loss": None if stats.loss is None else round(stats.loss, 4),
        "minibatches": stats.minibatches,
        "tokens": stats.tokens,
        "trainable_params": sum(p.numel() for p in tm.parameters()),
    }


def run(dry_run: bool, seed: int = 0) -> dict[str, Any]:
    import torch

    from whale_lab.backends.base import SamplingParams
    from whale_lab.backends.hf import HFBackend
    from whale_lab.config import config_from_dict
    from whale_lab.models import load_model_and_tokenizer
    from whale_lab.weights.checkpoint import save_full_weights
    from whale_lab.weights.lora import adapted_summary, attach
    from whale_lab.weights.sync import WeightSync

    t_start = time.perf_counter()
    cuda = torch.cuda.is_available() and not dry_run
    device = "cuda" if cuda else "cpu"
    dtype_name = "bfloat16" if cuda else "float32"
    dtype = getattr(torch, dtype_name)
    shape = TINY if dry_run else FULL
    import transformers

    out: dict[str, Any] = {"dry_run": dry_run, "device": device, "dtype": dtype_name,
                           "gpu": torch.cuda.get_device_name(0) if cuda else None,
                           "versions": {"torch": torch.__version__,
                                        "transformers": transformers.__version__}}  # fmt: skip
    if not cuda and not dry_run:
        out["error"] = "no CUDA device: run on the GPU box, or pass --dry-run"
        return out
    with tempfile.TemporaryDirectory(prefix="whale-gpu-check-") as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, shape, dtype, seed)
        out["model"] = {"params": params, "layers": shape["layers"], "hidden": shape["hidden"]}
        model, tok = load_model_and_tokenizer(str(folder), dtype=dtype_name, device=device)
        backend = HFBackend(model, tok, batch_size=shape["batch"], max_context_tokens=4096)
        prompts = _prompts(shape["batch"])
        sample = SamplingParams(temperature=1.0, top_p=1.0, top_k=20,
                                max_new_tokens=shape["new_tokens"], seed=seed)  # fmt: skip
        out["hf_generate"] = _generate(backend, prompts, sample, device)
        gens = backend.generate(prompts, sample)
        examples = _examples(backend, prompts, gens, int(tok.eos_token_id))

        # one LoRA step on every linear layer, trained in place: the hf backend serves it
        cfg = config_from_dict({"model": {"lora": {"rank": 16, "alpha": 32.0,
                                                   "target_modules": "all-linear"}}})  # fmt: skip
        lora = attach(model, tok, cfg)
        hf_sync = WeightSync(lora, encode=backend.encode_chat)
        hf_sync.remember()
        _stats, out["lora_step"] = _train_step(lora, examples, 5e-3, device)
        out["lora_step"]["adapted"] = adapted_summary(lora)
        out["lora_step"]["sync"] = _checked(lambda: hf_sync.check(backend, served_version="lora-1"))

        # one full fine-tuning step on a fresh copy
        full_model, _ = load_model_and_tokenizer(str(folder), dtype=dtype_name, device=device)
        full = attach(full_model, tok, config_from_dict({"rsft": {"full_finetune": True}}))
        full_backend = HFBackend(
            full_model, tok, batch_size=shape["batch"], max_context_tokens=4096
        )
        full_sync = WeightSync(full, encode=full_backend.encode_chat)
        vllm_sync = WeightSync(full)  # the same comparison, later against vLLM
        full_sync.remember()
        vllm_sync.remember()
        _stats, out["full_step"] = _train_step(full, examples, 1e-3 if cuda else 1e-2, device)
        out["full_step"]["sync"] = _checked(
            lambda: full_sync.check(full_backend, served_version="full-1")
        )

        out["vllm"] = _vllm_part(folder, Path(tmp), lora, full, vllm_sync, prompts, sample,
                                 dtype_name, cuda, save_full_weights)  # fmt: skip
    out["total_seconds"] = round(time.perf_counter() - t_start, 1)
    return out


def _vllm_part(
    folder: Path, tmp: Path, lora: Any, full: Any, full_sync: Any, prompts: list, sample: Any,
    dtype: str, cuda: bool, save_full_weights: Any,
) -> dict[str, Any]:  # fmt: skip
    """vLLM on the same prompts, the LoRA swap and both publishes, verified; or why not."""
    try:
        import vllm
    except ImportError as exc:
        return {"available": False, "reason": f"vllm is not installed ({exc})"}
    from whale_lab.backends.vllm import VLLMBackend
    from whale_lab.weights.sync import PROBE_PROMPTS, WeightSync

    out: dict[str, Any] = {"available": True, "version": getattr(vllm, "__version__", "?")}
    t0 = time.perf_counter()
    try:
        be = VLLMBackend(str(folder), dtype=dtype, max_context_tokens=4096, enable_lora=True,
                         max_lora_rank=16, gpu_memory_utilization=0.35 if cuda else 0.1)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the check reports what failed, in its JSON
        out["error"] = f"vLLM did not start: {exc}"
        return out
    out["start_seconds"] = round(time.perf_counter() - t0, 1)
    try:
        out["generate"] = _generate(be, prompts, sample, "cuda" if cuda else "cpu")
        adapter = lora.save_pretrained(tmp / "adapter")
        t0 = time.perf_counter()
        be.load_adapter(adapter, "lora-1")
        be.generate([list(PROBE_PROMPTS[0])], sample)
        out["lora_swap_seconds"] = round(time.perf_counter() - t0, 3)
        out["lora_sync"] = _checked(
            lambda: WeightSync(lora).check(
                be, served_version="lora-1", adapter="lora-1", baseline=True
            )
        )
        be.unload_adapter("lora-1")
        weights = tmp / "full.safetensors"
        save_full_weights(full, weights)
        t0 = time.perf_counter()
        be.load_weights(weights)
        out["weight_load_seconds"] = round(time.perf_counter() - t0, 3)
        out["full_sync"] = _checked(
            lambda: full_sync.check(be, served_version="full-1", label="full weights full-1")
        )
    except Exception as exc:  # noqa: BLE001 - one failed step is a figure, not a traceback
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        be.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="a tiny model on the CPU: every step's code path, no timing value",
    )
    ap.add_argument("--seed", type=int, default=0)  # fmt: skip
    args = ap.parse_args(argv)
    out = run(args.dry_run, seed=args.seed)
    print(json.dumps(out, indent=1))
    return 0 if healthy(out) else 1


def healthy(out: dict[str, Any]) -> bool:
    """Every step ran and every publish was verified (vLLM's only where it is installed)."""
    if "error" in out:
        return False
    syncs = [out["lora_step"]["sync"], out["full_step"]["sync"]]
    v = out.get("vllm", {})
    if v.get("available"):
        if "error" in v:
            return False
        syncs += [v["lora_sync"], v["full_sync"]]
    return all(s.get("status") == "verified" for s in syncs)


if __name__ == "__main__":
    sys.exit(main())
