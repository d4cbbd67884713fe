"""The SFT pass in data-parallel processes under accelerate (`rsft.launcher = "accelerate"`).

The engine keeps its training copy, optimizer and resume points as with one process; only the
pass itself moves out. Each step it writes a job folder (the accepted examples, the trainable
weights and the optimizer state as they are now, the config), starts `rsft.processes` workers
(`weights/dist_worker.py`) and waits; rank 0 writes the updated weights, optimizer state and
statistics back, and the engine copies them into its live model, so publishing, the served-policy
check and resume work as before. Every worker builds the same minibatches and takes its share of
each one, so the update equals the single-process update on the same global batch (the test
checks loss and weights within float tolerance).

On CUDA the workers start through `accelerate launch`: DDP (`--multi_gpu`) for LoRA, FSDP2
(`--use_fsdp`, transformer layers wrapped, full state dicts) for full fine-tuning. Without CUDA,
through `torch.distributed.run`, the launcher accelerate itself uses, where accelerate gives DDP
over gloo (accelerate's own CPU launcher needs MPI).

Cost: the workers load the model and the job's tensors every step (seconds for a 2B-4B model,
small against a step's rollouts); the processes hold one model copy each besides the engine's.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from whale_lab.config import Config
from whale_lab.weights.lora import TrainableModel, WeightsError
from whale_lab.weights.sft import SftExample, SftStats

JOB_FILE = "job.json"
EXAMPLES_FILE = "examples.jsonl"
TRAINABLE_IN = "trainable.safetensors"
OPTIMIZER_IN = "optimizer.pt"
OUT_DIR = "out"
STATS_FILE = "stats.json"
_LOG_TAIL = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_command(job: Path, processes: int, *, cuda: bool, fsdp: bool, port: int) -> list[str]:
    """The command that starts the workers (see the module docstring for why two forms)."""
    worker = ["-m", "whale_lab.weights.dist_worker", str(job)]
    if not cuda:
        return [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
            "--master_addr", "127.0.0.1", "--master_port", str(port), *worker,
        ]  # fmt: skip
    mode = (
        ["--use_fsdp", "--fsdp_version", "2", "--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP",
         "--fsdp_state_dict_type", "FULL_STATE_DICT", "--fsdp_reshard_after_forward", "true"]
        if fsdp
        else ["--multi_gpu"]
    )  # fmt: skip
    return [
        sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(processes),
        "--num_machines", "1", "--main_process_port", str(port), "--mixed_precision", "no",
        "--dynamo_backend", "no", *mode, *worker,
    ]  # fmt: skip


def write_examples(path: Path, examples: Sequence[SftExample]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for e in examples:
            row = {"i": list(e.input_ids), "l": list(e.labels), "t": e.trajectory}
            row.update(task=e.task_id, r=e.reencoded)
            f.write(json.dumps(row) + "\n")


def read_examples(path: Path) -> list[SftExample]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        out.append(SftExample(tuple(r["i"]), tuple(r["l"]), r["task"], r["r"], r["t"]))
    return out


class DistributedTrainer:
    """Runs `sft_pass` in worker processes; `pass_` has the in-process pass's contract."""

    def __init__(self, cfg: Config, job_root: str | Path) -> None:
        self.cfg = cfg
        self.job = Path(job_root)
        self.processes = cfg.rsft.processes

    def strategy(self, tm: TrainableModel, cuda: bool) -> str:
        return "fsdp" if cuda and not tm.lora else "ddp"

    def pass_(
        self, tm: TrainableModel, optimizer: Any, examples: Sequence[SftExample], *, seed: int
    ) -> SftStats:
        import torch
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_optimizer_state_dict,
        )

        from whale_lab.weights.checkpoint import load_trainable, save_trainable

        if not examples:
            return SftStats(None, 0, 0, None, 0, 0, 0, 0.0)
        shutil.rmtree(self.job, ignore_errors=True)
        (self.job / OUT_DIR).mkdir(parents=True)
        cuda = tm.device.type == "cuda"
        strategy = self.strategy(tm, cuda)
        full = StateDictOptions(full_state_dict=True, cpu_offload=True)
        job = {
            "config": self.cfg.to_dict(),
            "seed": seed,
            "strategy": strategy,
            "cuda": cuda,
            "has_optimizer_state": bool(optimizer.state),
        }
        (self.job / JOB_FILE).write_text(json.dumps(job), encoding="utf-8")
        write_examples(self.job / EXAMPLES_FILE, examples)
        save_trainable(tm, self.job / TRAINABLE_IN)
        if optimizer.state:
            torch.save(get_optimizer_state_dict(tm.model, optimizer, options=full),
                       self.job / OPTIMIZER_IN)  # fmt: skip
        cmd = launch_command(
            self.job, self.processes, cuda=cuda, fsdp=strategy == "fsdp", port=_free_port()
        )
        log = self.job / "workers.log"
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with log.open("w", encoding="utf-8") as out:
            rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
        if rc != 0 or not (self.job / OUT_DIR / STATS_FILE).exists():
            tail = " ".join(log.read_text(encoding="utf-8", errors="replace").split()[-80:])
            raise WeightsError(
                f"rsft.launcher = 'accelerate': the {self.processes} training processes failed "
                f"(exit {rc}; log {log}): {tail[-_LOG_TAIL:]}"
            )
        load_trainable(tm, self.job / OUT_DIR / TRAINABLE_IN)
        state = torch.load(self.job / OUT_DIR / OPTIMIZER_IN, map_location="cpu", weights_only=True)
        set_optimizer_state_dict(tm.model, optimizer, state, options=full)
        data = json.loads((self.job / OUT_DIR / STATS_FILE).read_text(encoding="utf-8"))
        return SftStats(**data)
