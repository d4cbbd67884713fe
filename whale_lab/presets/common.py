"""What every preset shares: the cache folder, the shipped micro folder and the chat format.

It imports nothing from whale-lab, so each preset module (and the loader) can use it without a
cycle.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
MICRO_DIR = PACKAGE_DIR / "micro" / "model"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def cache_dir() -> Path:
    """Where locally built model folders live (WHALE_LAB_CACHE, else the XDG cache), created."""
    base = os.environ.get("WHALE_LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "whale-lab"
    )
    p = Path(base)
    p.mkdir(parents=True, exist_ok=True)
    return p
