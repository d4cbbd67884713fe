"""Model backends behind one interface (`base.Backend`); `make_backend(cfg)` picks one by name.

`hf` and `openai` import no heavy library at module level; `vllm` is imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from whale_lab.backends.base import Backend, BackendError, Generation, Message, SamplingParams
from whale_lab.backends.hf import HFBackend
from whale_lab.backends.openai import OpenAIBackend

if TYPE_CHECKING:
    from whale_lab.config import Config


def _openai(cfg: Config, model: Any = None, tokenizer: Any = None) -> Backend:
    from whale_lab.backends.openai_pool import openai_backend

    return openai_backend(cfg, model, tokenizer)


def _vllm(cfg: Config, model: Any = None, tokenizer: Any = None) -> Backend:
    from whale_lab.backends.vllm import VLLMBackend

    return VLLMBackend.from_config(cfg, model, tokenizer)


BACKENDS: dict[str, Callable[..., Backend]] = {
    "hf": HFBackend.from_config,
    "openai": _openai,  # one endpoint, or a pool when model.base_url is a list
    "vllm": _vllm,
}


def make_backend(cfg: Config, model: Any = None, tokenizer: Any = None) -> Backend:
    """The backend `cfg.model.backend` names; `hf` reuses `model`/`tokenizer` when given."""
    name = cfg.model.backend
    factory = BACKENDS.get(name)
    if factory is None:
        raise BackendError(
            f"model.backend: unknown backend {name!r}; choose one of {', '.join(BACKENDS)}"
        )
    return factory(cfg, model, tokenizer)


__all__ = [
    "BACKENDS",
    "Backend",
    "BackendError",
    "Generation",
    "HFBackend",
    "Message",
    "OpenAIBackend",
    "SamplingParams",
    "make_backend",
]
