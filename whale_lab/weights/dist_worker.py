"""One data-parallel training process of `weights/distributed.py` (started by its launcher).

It rebuilds the trainable model exactly as the engine has it (the same model folder, LoRA
settings and seed, then the job's trainable tensors and optimizer state), lets accelerate wrap it
(DDP, or FSDP for full fine-tuning on CUDA), runs `sft_pass` on its share of every minibatch and,
on rank 0, writes the updated tensors, optimizer state and statistics for the engine.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path


def main(job_dir: str) -> int:
    import torch
    import torch.distributed as dist
    from accelerate import Accelerator, FullyShardedDataParallelPlugin
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    from whale_lab.config import config_from_dict
    from whale_lab.models import load_model_and_tokenizer
    from whale_lab.weights import distributed as d
    from whale_lab.weights.checkpoint import load_trainable
    from whale_lab.weights.lora import attach
    from whale_lab.weights.sft import enable_checkpointing, end_token_id, sft_pass

    job = Path(job_dir)
    spec = json.loads((job / d.JOB_FILE).read_text(encoding="utf-8"))
    cfg = config_from_dict(spec["config"])
    fsdp = spec["strategy"] == "fsdp"
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if fsdp else None
    acc = Accelerator(cpu=not spec["cuda"], fsdp_plugin=plugin)
    model, tok = load_model_and_tokenizer(cfg.model.path, dtype=cfg.model.dtype, device="cpu")
    tm = attach(model, tok, cfg)
    load_trainable(tm, job / d.TRAINABLE_IN)
    if cfg.rsft.gradient_checkpointing:
        enable_checkpointing(tm)
    optimizer = torch.optim.AdamW(
        tm.parameters(), lr=cfg.rsft.learning_rate, weight_decay=cfg.rsft.weight_decay
    )
    wrapped, optimizer = acc.prepare(tm.model, optimizer)
    inner = acc.unwrap_model(wrapped)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if spec["has_optimizer_state"]:
        state = torch.load(job / d.OPTIMIZER_IN, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(inner, optimizer.optimizer, state, options=full)
    examples = d.read_examples(job / d.EXAMPLES_FILE)
    pad = tok.pad_token_id
    eos = end_token_id(tok, model)

    def reduce(x: float) -> float:
        t = torch.tensor([x], dtype=torch.float64, device=acc.device)
        dist.all_reduce(t)
        return float(t.item())

    stats = sft_pass(
        wrapped,
        optimizer,
        examples,
        minibatch_size=cfg.rsft.minibatch_size,
        max_grad_norm=cfg.rsft.max_grad_norm,
        pad_id=int(pad if pad is not None else eos),
        params=[p for p in wrapped.parameters() if p.requires_grad],
        seed=int(spec["seed"]),
        device=acc.device,
        minibatch_unit=cfg.rsft.minibatch_unit,
        rank=acc.process_index,
        world=acc.num_processes,
        reduce=reduce if acc.num_processes > 1 else None,
        clip=lambda params, norm: acc.clip_grad_norm_(params, norm),
    )
    trainable = {n for n, p in inner.named_parameters() if p.requires_grad}
    weights = get_model_state_dict(inner, options=full)
    opt_state = get_optimizer_state_dict(inner, optimizer.optimizer, options=full)
    if acc.is_main_process:
        from safetensors.torch import save_file

        out = job / d.OUT_DIR
        kept = {n: t.detach().cpu().contiguous() for n, t in weights.items() if n in trainable}
        save_file(kept, str(out / d.TRAINABLE_IN))
        torch.save(opt_state, out / d.OPTIMIZER_IN)
        (out / d.STATS_FILE).write_text(json.dumps(dataclasses.asdict(stats)), encoding="utf-8")
    acc.wait_for_everyone()
    acc.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
