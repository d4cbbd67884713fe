"""Model loading: every model, shipped or built locally, loads with `from_pretrained`.

Preset names resolve through `whale_lab.presets`; the preset names and helpers are re-exported here
so that existing `from whale_lab.models import ...` lines keep working.
"""

from __future__ import annotations

from typing import Any

from whale_lab.errors import BackendError
from whale_lab.presets import resolve_model_path
from whale_lab.presets.common import (
    CHAT_TEMPLATE,
    MICRO_DIR,
    PACKAGE_DIR,
    SPECIAL_TOKENS,
    cache_dir,
)
from whale_lab.presets.tiny_random import build_tiny_random, train_byte_bpe_tokenizer

__all__ = [
    "CHAT_TEMPLATE",
    "MICRO_DIR",
    "PACKAGE_DIR",
    "SPECIAL_TOKENS",
    "build_tiny_random",
    "cache_dir",
    "load_model_and_tokenizer",
    "resolve_model_path",
    "train_byte_bpe_tokenizer",
]


def load_model_and_tokenizer(name: str, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a preset, folder or hub id; clear errors otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except Exception as exc:  # OSError, SafetensorError, ValueError from a damaged or foreign folder
        raise BackendError(f"model.path {name!r}: cannot load the model from {path}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    model.to(device)
    model.eval()
    return model, tokenizer
