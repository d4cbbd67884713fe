"""The `smollm2-135m` preset, kept importable from here; it lives in `whale_lab.presets.smollm2`."""

from __future__ import annotations

from whale_lab.presets.smollm2 import (
    DISTRIBUTION,
    FOLDER_NAME,
    INSTALL_HINT,
    PACKAGE,
    convert_gguf,
    find_gguf,
    smollm2_folder,
)

__all__ = [
    "DISTRIBUTION",
    "FOLDER_NAME",
    "INSTALL_HINT",
    "PACKAGE",
    "convert_gguf",
    "find_gguf",
    "smollm2_folder",
]
