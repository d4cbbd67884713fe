"""Whether this machine has the device `model.device` names, asked of torch when a model is placed.

The config checks the form of the name (`auto`, `cpu`, `cuda`, `cuda:N`, `mps`) without torch; only
here, where a model is about to be loaded, is torch asked whether that device exists, so that
`cuda:99` or CUDA on a CPU-only build is one line naming the key instead of a traceback from deep
inside `model.to`. torch is imported lazily: importing this module costs nothing.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from whale_lab.config import DEVICE_FORMS, DEVICE_PATTERN, Config, ConfigError

KEY = "model.device"


def _cuda_problem(torch: Any, spec: str, index: int | None) -> str | None:
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return (
            f"{spec!r} needs a CUDA build of torch, but torch {torch.__version__} was built "
            f"without CUDA; use cpu (or auto), or install a CUDA build of torch"
        )
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError) as exc:  # a broken driver reports here
        return f"{spec!r}: CUDA cannot start on this machine ({str(exc).splitlines()[0]})"
    if count == 0:
        return (
            f"{spec!r} but no CUDA device is visible (no GPU, no driver, or "
            f"CUDA_VISIBLE_DEVICES hides them); use cpu or auto"
        )
    if index is not None and index >= count:
        have = "cuda:0" if count == 1 else f"cuda:0 to cuda:{count - 1}"
        return f"{spec!r} but this machine has {count} CUDA device(s) ({have})"
    return None


def _mps_problem(torch: Any) -> str | None:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return f"'mps' but torch {torch.__version__} was built without MPS; use cpu or auto"
    if not mps.is_available():
        return "'mps' but MPS is not available on this machine (it needs Apple silicon); use cpu"
    return None


def resolve_device(spec: str) -> str:
    """The torch device `spec` names on this machine ("auto": cuda, else mps, else cpu).

    A device this machine lacks is a ConfigError naming `model.device`, what was asked and
    what there is.
    """
    match = re.fullmatch(DEVICE_PATTERN, spec)
    if match is None:
        raise ConfigError(f"{KEY}: expected {DEVICE_FORMS}, got {spec!r}")
    if spec == "cpu":
        return spec
    import torch

    if spec == "auto":
        if _cuda_problem(torch, "cuda", None) is None:
            return "cuda"
        return "mps" if _mps_problem(torch) is None else "cpu"
    if spec == "mps":
        problem = _mps_problem(torch)
    else:
        index = int(spec.split(":", 1)[1]) if ":" in spec else None
        problem = _cuda_problem(torch, spec, index)
    if problem:
        raise ConfigError(f"{KEY}: {problem}")
    return spec


def with_device(cfg: Config) -> Config:
    """`cfg` with `model.device` resolved for this machine (checked; "auto" made concrete)."""
    device = resolve_device(cfg.model.device)
    if device == cfg.model.device:
        return cfg
    return cfg.replace(model=dataclasses.replace(cfg.model, device=device))
