"""One generation interface for every backend: a batch of chats in, one completion each out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from whale_lab.errors import WhaleLabError

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 20
    max_new_tokens: int = 96
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length", "error"]
    token_ids: tuple[int, ...] = ()
    error: str = ""


class BackendError(WhaleLabError, RuntimeError):
    """A backend problem a user can act on (server down, model folder unusable, ...)."""


@runtime_checkable
class Backend(Protocol):
    name: str

    def generate(self, prompts: Sequence[Sequence[Message]], params: SamplingParams) -> list[Generation]:
        """One batched generation over every prompt; order preserved."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens the chat takes once templated (for context-length checks)."""
        ...

    def close(self) -> None: ...
