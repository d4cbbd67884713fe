"""The `micro` preset: the model shipped in `whale_lab/micro/model/`, trained by `micro pretrain`."""

from __future__ import annotations

from pathlib import Path

from whale_lab.presets.common import MICRO_DIR
from whale_lab.presets.tiny_random import tiny_random_folder


def micro_folder() -> Path:
    """The shipped micro folder; until it exists, the tiny random model stands in."""
    if (MICRO_DIR / "config.json").exists():
        return MICRO_DIR
    return tiny_random_folder()
