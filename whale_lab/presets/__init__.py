"""Model presets: a short name that resolves to a model folder on disk.

Presets resolve to folders on disk; nothing on the default path downloads. A hub id still works for
users who have a hub, through the same `from_pretrained` call. Each preset is a function that
returns its folder (building or converting it on first use); `PRESETS` maps names to them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from whale_lab.errors import BackendError
from whale_lab.presets.micro import micro_folder
from whale_lab.presets.smollm2 import smollm2_folder
from whale_lab.presets.tiny_random import tiny_random_folder

PRESETS: dict[str, Callable[[], Path]] = {
    "micro": micro_folder,
    "tiny-random": tiny_random_folder,
    "smollm2-135m": smollm2_folder,
}


def resolve_model_path(name: str) -> str:
    """Preset name -> local folder (building it if it is built locally); other names pass through."""
    preset = PRESETS.get(name)
    if preset is not None:
        return str(preset())
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise BackendError(f"model folder {p} has no config.json: not a transformers model folder")
        return str(p)
    if name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1:
        raise BackendError(f"model path {name!r} does not exist")
    return name  # a hub id: from_pretrained will try it (and fail clearly offline)


__all__ = ["PRESETS", "resolve_model_path"]
