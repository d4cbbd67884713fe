"""Several independent OpenAI-compatible endpoints serving one model, as one backend.

`model.base_url` as a list starts one `OpenAIBackend` per endpoint (each with its own client,
`model.concurrency` requests in flight, server checks and adapters). Every prompt of a batch goes
to the endpoint with the fewest requests outstanding at that moment (ties to the first), so a slow
or busy endpoint gets less work and a fast one more, and prompt i keeps the seed it would have on
one endpoint (its own `Prompt.seed`, else `seed + i`). A publish loads the adapter into every endpoint, and the served-policy
check (`weights/sync.py`) probes each endpoint on its own, so one endpoint left on stale weights
stops the run with its URL in the message.

For vLLM's own scaling behind one URL (tensor parallel inside a replica, data parallel replicas
behind one server) keep a single base_url: that server balances by itself.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.backends.base import (
    BackendError,
    Generation,
    Message,
    Prompt,
    PromptLike,
    SamplingParams,
    check_params,
    prompt_messages,
    row_seed,
)
from whale_lab.backends.openai import OpenAIBackend

if TYPE_CHECKING:
    from whale_lab.config import Config


class EndpointPool:
    """One backend over `endpoints`: least-outstanding-requests dispatch, publishes to all."""

    name = "openai"

    def __init__(self, endpoints: Sequence[OpenAIBackend]) -> None:
        if len(endpoints) < 1:
            raise BackendError("model.base_url: the list of endpoints is empty")
        urls = [e.base_url for e in endpoints]
        dup = sorted({u for u in urls if urls.count(u) > 1})
        if dup:
            raise BackendError(f"model.base_url: {dup[0]} is listed more than once")
        self.endpoints = list(endpoints)
        self.outstanding = [0] * len(self.endpoints)
        self.sent = [0] * len(self.endpoints)  # requests each endpoint was given, for the log
        self._lock = threading.Lock()
        workers = sum(e.concurrency for e in self.endpoints)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="whale-pool")

    @classmethod
    def from_config(cls, cfg: Config, model: Any = None, tokenizer: Any = None) -> EndpointPool:
        urls = cfg.model.base_url
        assert not isinstance(urls, str)
        if not urls:
            raise BackendError("model.base_url: the list of endpoints is empty")
        first = OpenAIBackend.from_config(_one(cfg, urls[0]), model, tokenizer)
        rest = [OpenAIBackend.from_config(_one(cfg, u), model, first.tokenizer) for u in urls[1:]]
        return cls([first, *rest])

    # ------------------------------------------------------------------ what callers read
    @property
    def tokenizer(self) -> Any:
        return self.endpoints[0].tokenizer

    @property
    def verify(self) -> bool:
        return any(e.verify for e in self.endpoints)

    @property
    def base_url(self) -> str:
        return ", ".join(e.base_url for e in self.endpoints)

    @property
    def server_label(self) -> str:
        return f"{len(self.endpoints)} endpoints ({self.base_url})"

    @property
    def adapters(self) -> dict[str, str]:
        return self.endpoints[0].adapters

    @property
    def active_model(self) -> str:
        return self.endpoints[0].active_model

    @active_model.setter
    def active_model(self, name: str) -> None:
        for e in self.endpoints:
            e.active_model = name

    def encode(self, messages: Sequence[Message], *, where: str = "prompt") -> Prompt:
        return self.endpoints[0].encode(messages, where=where)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.endpoints[0].count_tokens(messages)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        check_params(params)
        msgs = [prompt_messages(p, f"prompt {i}") for i, p in enumerate(prompts)]
        seeds = [row_seed(p, params, i) for i, p in enumerate(prompts)]
        futures = [
            self._pool.submit(self._one_request, m, params, s)
            for m, s in zip(msgs, seeds, strict=True)
        ]
        return [f.result() for f in futures]

    def _one_request(
        self, messages: list[dict[str, str]], params: SamplingParams, seed: int | None
    ) -> Generation:
        """One prompt on the least busy endpoint, as prompt 0 of its own call with `seed`."""
        with self._lock:
            k = min(range(len(self.endpoints)), key=lambda j: (self.outstanding[j], j))
            self.outstanding[k] += 1
            self.sent[k] += 1
        seeded = params if seed is None else dataclasses.replace(params, seed=seed)
        try:
            (gen,) = self.endpoints[k].generate([messages], seeded)
        finally:
            with self._lock:
                self.outstanding[k] -= 1
        return gen

    # ------------------------------------------------------------------ checks and adapters
    def preflight(self, adapters: bool = False) -> None:
        for e in self.endpoints:
            e.preflight(adapters=adapters)

    def load_adapter(self, path: str | Path, name: str) -> None:
        """The adapter on every endpoint (each unloads the one it replaces)."""
        for e in self.endpoints:
            e.load_adapter(path, name)

    def load_weights(self, path: str | Path) -> None:
        """Full weights into every endpoint."""
        for e in self.endpoints:
            e.load_weights(path)

    def unload_adapter(self, name: str) -> None:
        for e in self.endpoints:
            e.unload_adapter(name)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for e in self.endpoints:
            e.close()


def _one(cfg: Config, url: str) -> Config:
    return cfg.replace(model=dataclasses.replace(cfg.model, base_url=url))


def openai_backend(cfg: Config, model: Any = None, tokenizer: Any = None) -> Any:
    """`model.base_url` as one URL: one endpoint; as a list: a pool of them."""
    if isinstance(cfg.model.base_url, str):
        return OpenAIBackend.from_config(cfg, model, tokenizer)
    if len(cfg.model.base_url) == 1:
        return OpenAIBackend.from_config(_one(cfg, cfg.model.base_url[0]), model, tokenizer)
    return EndpointPool.from_config(cfg, model, tokenizer)
