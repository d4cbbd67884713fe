"""One generation interface for every backend: a batch of chats in, one completion each out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from whale_lab.errors import BackendError  # noqa: F401 - re-exported: the backends' error

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 20
    max_new_tokens: int = 96
    # No end-of-sequence token before this many new tokens: for the weight-sync probes, which
    # need tokens to compare even from a model that learnt to stop at once (they use no stop
    # strings). Log-probabilities stay those of the raw distribution, EOS included.
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # Return each generated token's log-probability under the served weights (raw model
    # distribution, before temperature/top-p/top-k): what a weight-sync check compares.
    logprobs: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: Literal["stop", "length", "error"]
    token_ids: tuple[int, ...] = ()  # the sampled ids (what training should target)
    error: str = ""
    token_logprobs: tuple[float, ...] = ()  # one per token_ids entry, when params.logprobs


@dataclass(frozen=True)
class Prompt:
    """A chat rendered and tokenised once: its length for the caller's context check, and what
    `generate` takes without rendering it again (the rollout engine does both every turn)."""

    messages: tuple[Message, ...]  # checked plain dicts
    tokens: int  # its length once templated (an estimate where `ids` is empty and `exact` False)
    ids: tuple[int, ...] = ()  # the token ids, where the backend tokenises locally
    exact: bool = True
    # Which encoding made it (tokenizer and template settings): a backend re-encodes a Prompt
    # made under another one rather than trust its ids.
    encoding: object = None
    # This prompt's own sampling seed (the rollout derives one per episode and turn), so its
    # sample depends neither on its place in the call nor on what else is in it. None: the
    # call's `SamplingParams.seed` with the prompt's index, as before.
    seed: int | None = None


# What `generate` takes: chats, or Prompts from the same backend's `encode`.
PromptLike = Sequence[Message] | Prompt


@runtime_checkable
class Backend(Protocol):
    name: str

    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        """One batched generation over every prompt; order preserved."""
        ...

    def encode(self, messages: Sequence[Message], *, where: str = "prompt") -> Prompt:
        """The chat rendered and tokenised once, for a length check and then `generate`."""
        ...

    def count_tokens(self, messages: Sequence[Message]) -> int:
        """Tokens the chat takes once templated (for context-length checks)."""
        ...

    def close(self) -> None: ...


# Input checks and stop handling every backend shares; they live here so backends never import
# each other.


def encode_with(backend: Any, messages: Sequence[Message], where: str = "prompt") -> Prompt:
    """`backend.encode`, or for a backend that only counts tokens, its count with the messages."""
    encode = getattr(backend, "encode", None)
    if callable(encode):
        return encode(messages, where=where)
    return Prompt(tuple(check_messages(messages, where)), int(backend.count_tokens(messages)))


def prompt_seed(prompt: PromptLike) -> int | None:
    """The prompt's own sampling seed; None for a chat or a Prompt without one."""
    return prompt.seed if isinstance(prompt, Prompt) else None


def row_seed(prompt: PromptLike, params: SamplingParams, index: int) -> int | None:
    """The seed a backend that takes one per request sends for prompt `index` of a call: the
    prompt's own, else the call's seed plus the index (equal prompts, other samples)."""
    own = prompt_seed(prompt)
    if own is not None:
        return own
    return None if params.seed is None else params.seed + index


def prompt_messages(prompt: PromptLike, where: str) -> list[dict[str, str]]:
    """The checked messages of a chat or of a Prompt (whose messages were checked already)."""
    if isinstance(prompt, Prompt):
        return list(prompt.messages)
    return check_messages(prompt, where)


def check_messages(messages: Sequence[Message], where: str) -> list[dict[str, str]]:
    """Chat messages as plain dicts, or a BackendError naming the bad message."""
    out: list[dict[str, str]] = []
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise BackendError(
            f"{where}: expected a list of chat messages, got {type(messages).__name__}"
        )
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise BackendError(
                f"{where}, message {i}: expected a dict with a 'role' string, got {m!r:.80}"
            )
        content = m.get("content")
        if not isinstance(content, str):
            raise BackendError(
                f"{where}, message {i} ({m['role']}): content must be a string, "
                f"got {type(content).__name__}"
            )
        out.append({"role": m["role"], "content": content})
    return out


def check_params(params: SamplingParams) -> None:
    """Reject sampling settings no backend can honour, naming the field."""
    if params.temperature < 0:
        raise BackendError(f"sampling temperature must be >= 0, got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise BackendError(f"sampling top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise BackendError(f"sampling top_k must be >= 0 (0 turns it off), got {params.top_k}")
    if params.max_new_tokens < 1:
        raise BackendError(f"sampling max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if not 0 <= params.min_new_tokens <= params.max_new_tokens:
        raise BackendError(
            f"sampling min_new_tokens must be in [0, max_new_tokens={params.max_new_tokens}], "
            f"got {params.min_new_tokens}"
        )
    for s in params.stop:
        if not isinstance(s, str) or not s:
            raise BackendError(f"stop sequences must be non-empty strings, got {s!r}")


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a reply: the model's generation config's, then the tokenizer's."""
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found = [*(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])]
    found.append(getattr(tokenizer, "eos_token_id", None))
    return list(dict.fromkeys(v for v in found if isinstance(v, int)))


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Text before the earliest stop sequence (OpenAI semantics: the stop string is not returned)."""
    best = -1
    for s in stop:
        pos = text.find(s)
        if pos != -1 and (best == -1 or pos < best):
            best = pos
    return (text, False) if best == -1 else (text[:best], True)
