"""Checkpoints of the weight phase, laid out so that a kill -9 at any moment leaves a usable one.

Under `<run>/weights/`:
  resume/step-NNNNNN-T/ trainable weights, optimizer state and the phase state after step N;
                        written into a temp folder, renamed, and only then pointed at by
  latest.json           (atomic), so a torn checkpoint is never the one resumed from.
  checkpoints/step-NNNNNN/   the adapter (or full model) at each evaluation, with meta.json
  best.json             the best-by-val evaluation checkpoint
  adapters/step-NNNNNN/ the adapter served after step N (openai backend: load_adapter)
  served/step-NNNNNN.safetensors  the full weights served after step N (vLLM: load_weights)

Everything a server may read (served adapters and weights, evaluation checkpoints) is made
world-readable: a `vllm serve` running as another user must open it, and safetensors writes 0600.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from whale_lab.store import atomic_write_json, read_json
from whale_lab.weights.lora import TrainableModel, WeightsError


class CheckpointError(WeightsError):
    """A checkpoint that cannot be used: missing, torn, or made for other weights."""


TRAINABLE_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "state.json"


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def make_readable(path: Path) -> None:
    """Files 0644 and folders 0755 under `path` (itself included): readable by any user."""
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def save_full_weights(tm: TrainableModel, path: str | Path) -> None:
    """Every weight of the model under its transformers name, in one safetensors file (what
    vLLM's `load_weights` takes); tied tensors are written once."""
    from safetensors.torch import save_file

    seen: set[int] = set()
    tensors = {}
    for name, p in tm.base.state_dict().items():
        key = p.data_ptr()
        if key in seen:
            continue
        seen.add(key)
        tensors[name] = p.detach().contiguous()
    save_file(tensors, str(path))


def save_trainable(tm: TrainableModel, path: str | Path) -> None:
    """Exactly the parameters being trained (LoRA or all), by name, as safetensors."""
    from safetensors.torch import save_file

    tensors = {n: p.detach().to("cpu").contiguous().clone() for n, p in tm.named_trainable()}
    save_file(tensors, str(path))


def load_trainable(tm: TrainableModel, path: str | Path) -> None:
    """Copy saved values into the live parameters (no model reload; the backend keeps serving)."""
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path.parent} has no {path.name}")
    try:
        saved = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - a torn or foreign file: say which
        raise CheckpointError(f"cannot read {path}: {exc}") from None
    live = dict(tm.named_trainable())
    if set(saved) != set(live):
        only_saved = sorted(set(saved) - set(live))[:1]
        only_live = sorted(set(live) - set(saved))[:1]
        raise CheckpointError(
            f"checkpoint {path.parent} was saved for different trainable weights "
            f"({len(saved)} tensors vs {len(live)} here; e.g. {only_saved or only_live}): "
            "the model, LoRA settings or full_finetune changed"
        )
    for name, p in live.items():  # check everything before changing anything
        t = saved[name]
        if tuple(t.shape) != tuple(p.shape):
            raise CheckpointError(
                f"checkpoint {path.parent}: {name} has shape {tuple(t.shape)}, "
                f"the model has {tuple(p.shape)}: the model or model.lora.rank changed"
            )
    with torch.no_grad():
        for name, p in live.items():
            p.copy_(saved[name].to(device=p.device, dtype=p.dtype))


def save_optimizer(optimizer: Any, path: str | Path) -> None:
    import torch

    torch.save(optimizer.state_dict(), str(path))


def load_optimizer(optimizer: Any, path: str | Path) -> None:
    import torch

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path.parent} has no {path.name}")
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        optimizer.load_state_dict(state)
    except (RuntimeError, ValueError, KeyError, EOFError, OSError) as exc:
        raise CheckpointError(f"cannot restore optimizer state from {path}: {exc}") from None


class Checkpointer:
    """Owns `<run>/weights/`; every write is complete before anything points at it."""

    def __init__(self, root: str | Path, keep_resume: int = 2, keep_served: int = 2) -> None:
        self.root = Path(root)
        self.keep_resume = max(1, keep_resume)
        self.keep_served = max(1, keep_served)

    # ---------------------------------------------------------------- resume points
    def save_resume(self, step: int, tm: TrainableModel, optimizer: Any, state: dict) -> Path:
        """A new folder per save (never overwritten), then the pointer, then old ones pruned."""
        final = self.root / "resume" / f"{step_name(step)}-{time.time_ns()}"
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_trainable(tm, tmp / TRAINABLE_FILE)
        save_optimizer(optimizer, tmp / OPTIMIZER_FILE)
        atomic_write_json(tmp / STATE_FILE, state)
        os.replace(tmp, final)
        atomic_write_json(
            self.root / "latest.json",
            {"step": step, "dir": str(final.relative_to(self.root))},
        )
        self._prune(self.root / "resume", self.keep_resume, keep={final.name})
        return final

    def update_state(self, path: str | Path, state: dict) -> None:
        """Replace only the phase state of a resume point (same step: weights did not change)."""
        atomic_write_json(Path(path) / STATE_FILE, state)

    def latest(self) -> dict[str, Any] | None:
        """{"step", "path"} of the newest complete resume point, or None."""
        data = read_json(self.root / "latest.json")
        if not isinstance(data, dict) or "dir" not in data:
            return None
        path = self.root / str(data["dir"])
        if not (path / STATE_FILE).exists():
            return None
        return {"step": int(data.get("step", 0)), "path": str(path)}

    def load_resume(self, path: str | Path, tm: TrainableModel, optimizer: Any) -> dict[str, Any]:
        """Weights and optimizer restored in place; returns the saved phase state."""
        path = Path(path)
        if not path.is_dir():
            raise CheckpointError(f"resume point {path} does not exist")
        state = read_json(path / STATE_FILE)
        if not isinstance(state, dict):
            raise CheckpointError(f"resume point {path} has no readable {STATE_FILE}")
        load_trainable(tm, path / TRAINABLE_FILE)
        load_optimizer(optimizer, path / OPTIMIZER_FILE)
        return state

    # ---------------------------------------------------------------- evaluation checkpoints
    def save_eval(self, step: int, tm: TrainableModel, meta: dict[str, Any]) -> Path:
        final = self.root / "checkpoints" / step_name(step)
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tm.save_pretrained(tmp)
        atomic_write_json(tmp / "meta.json", meta)
        make_readable(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        return final

    def write_best(self, info: dict[str, Any]) -> None:
        atomic_write_json(self.root / "best.json", info)

    def read_best(self) -> dict[str, Any] | None:
        data = read_json(self.root / "best.json")
        return data if isinstance(data, dict) else None

    # ---------------------------------------------------------------- served adapters
    def save_served(self, step: int, tm: TrainableModel) -> Path:
        """The adapter a server loads after step N (a complete folder before it is named)."""
        final = self.root / "adapters" / step_name(step)
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tm.save_pretrained(tmp)
        make_readable(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        self._prune(self.root / "adapters", self.keep_served, keep={final.name})
        return final

    def save_served_weights(self, step: int, tm: TrainableModel) -> Path:
        """The full weights a vLLM engine loads after step N; only the newest file is kept
        (a 4B model is 8 GB a step in bf16)."""
        folder = self.root / "served"
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{step_name(step)}.safetensors"
        tmp = final.with_name(final.name + f".tmp{os.getpid()}")
        save_full_weights(tm, tmp)
        make_readable(tmp)
        os.replace(tmp, final)
        for old in folder.glob("step-*.safetensors*"):
            if old != final:
                old.unlink(missing_ok=True)
        return final

    @staticmethod
    def _prune(folder: Path, keep_n: int, keep: set[str]) -> None:
        dirs = sorted(p for p in folder.glob("step-*") if p.is_dir() and ".tmp" not in p.name)
        for p in dirs[:-keep_n]:
            if p.name not in keep:
                shutil.rmtree(p, ignore_errors=True)
        for p in folder.glob("step-*.tmp*"):  # torn saves of a killed process
            if p.is_dir() and not p.name.endswith(f".tmp{os.getpid()}"):
                shutil.rmtree(p, ignore_errors=True)
