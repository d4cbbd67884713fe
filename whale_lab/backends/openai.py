"""Generation through an OpenAI-compatible `/chat/completions` server (vLLM, `transformers serve`, ...).

A batch becomes one request per prompt, sent by a pool of `concurrency` threads over one HTTP client.
Timeouts, dropped connections, 429 and 5xx answers are retried with exponential backoff and jitter;
other 4xx answers are not. A server that cannot be reached fails the whole batch with a
`BackendError` that says what to do; a prompt whose answers stay unusable (bad JSON, no choices,
timeouts) gets `Generation(finish_reason="error")` so that one bad prompt never sinks the batch.

Adapters: `load_adapter(path, name)` uses vLLM's runtime LoRA endpoint, after which requests name the
adapter as their model, so harness search sees the weights RSFT just trained. The adapter it
replaces is unloaded from the server (`/v1/unload_lora_adapter`): the run serves one policy at a
time, and the checkpointer deletes superseded adapter folders, which the server must not keep
pointing at.

Honesty checks (on for a backend built from a config, before its first generation): `preflight()`
lists `/v1/models`, tells vLLM from `transformers serve` (each needs its own fields to sample),
resolves the model name and sends a one-token request, so a wrong name or a refusing server is one
line before any rollout; `check_sampling(params)` draws repeated samples of probe prompts and stops
when a server asked for temperature > 0 returns copies. `preflight(adapters=True)` also checks that
the runtime LoRA endpoint exists.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import threading
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from whale_lab.backends.base import (
    BackendError,
    Generation,
    Message,
    Prompt,
    PromptLike,
    SamplingParams,
    check_messages,
    check_params,
    cut_at_stop,
    prompt_messages,
    row_seed,
)
from whale_lab.backends.openai_checks import ServerChecks
from whale_lab.backends.openai_common import (
    SETUP_STATUSES,
    WEIGHT_LOADER_HINT,
    WEIGHT_LOADER_METHOD,
    Unreachable,
    log,
    sampling_key,
    short,
    unreachable_reason,
)

if TYPE_CHECKING:
    from whale_lab.config import Config


# Request fields that some servers reject (`transformers serve` refuses top_k, a few refuse seed).
# When a 400/422 names one, it is dropped for the rest of the backend's life and the request resent.
OPTIONAL_FIELDS = (
    "top_k",
    "seed",
    "min_tokens",
    "return_tokens_as_token_ids",
    "logprobs",
    "generation_config",
    "chat_template_kwargs",
)
# What `preflight` can tell a server to be; "" is "not looked at" (send the plain fields).
SERVER_LABELS = {
    "vllm": "vLLM",
    "transformers": "`transformers serve`",
    "openai": "an OpenAI-compatible server",
    "": "an OpenAI-compatible server",
}
# Prompts whose repeated samples must differ when the server samples; short, open-ended.
_TOKEN_ID = re.compile(r"token_id:(-?\d+)")
# Statuses that say "the request was fine, ask again later".
RETRY_STATUSES = frozenset({408, 409, 425, 429})
# 4xx statuses that, when every prompt of a batch gets them, mean the setup is wrong.
ADAPTER_HINT = (
    "start vLLM with --enable-lora (and --max-lora-rank at least the adapter's rank) and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


@dataclass
class _Failure:
    """Why the last attempt of one request failed."""

    kind: str  # "connect" | "timeout" | "transport" | "server" | "bad_answer" | "client"
    detail: str
    status: int = 0


def _server_detail(resp: httpx.Response) -> str:
    """The server's own error message, whatever shape its JSON error takes."""
    try:
        data = resp.json()
    except ValueError:
        return short(resp.text or resp.reason_phrase)
    if isinstance(data, dict):
        for key in ("detail", "message", "error"):
            val = data.get(key)
            if isinstance(val, dict):
                val = val.get("message", val)
            if val:
                return short(str(val))
    return short(str(data))


class OpenAIBackend(ServerChecks):
    """`/chat/completions` over HTTP with a thread pool, retries and runtime LoRA adapters."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 3,
        concurrency: int = 16,
        *,
        tokenizer: Any = None,
        backoff_s: float = 0.25,
        max_backoff_s: float = 8.0,
        server_kind: str = "",
        aliases: Sequence[str] = (),
        verify: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        full_weights: bool = False,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise BackendError(
                f"model.base_url must start with http:// or https://, got {base_url!r}"
            )
        if not model:
            raise BackendError(
                "the OpenAI-compatible backend needs a model name (model.served_model)"
            )
        if timeout_s <= 0 or max_retries < 0 or concurrency < 1:
            raise BackendError(
                f"bad backend settings: timeout_s={timeout_s} (> 0), max_retries={max_retries} "
                f"(>= 0), concurrency={concurrency} (>= 1)"
            )
        self.base_url = base_url.rstrip("/")
        self.base_model = model
        self.active_model = model
        self.api_key_env = api_key_env
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.tokenizer = tokenizer
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.adapters: dict[str, str] = {}  # name -> path, as loaded on the server
        # Sent with every request (vLLM renders the template with them, e.g. enable_thinking)
        # and used by the local tokenizer, so counted and trained tokens match the served ones.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        # The run publishes full weights (full fine-tuning), not adapters: preflight checks
        # the server's /collective_rpc rather than its LoRA endpoints.
        self.full_weights = full_weights
        self.dropped_fields: set[str] = set()
        if server_kind not in SERVER_LABELS:
            raise BackendError(
                f"unknown server kind {server_kind!r}; one of {', '.join(k for k in SERVER_LABELS if k)}"
            )
        # "vllm" | "transformers" | "openai" (looked at, neither) | "" (not looked at: plain fields)
        self.server_kind = server_kind
        # Other names the model may be served under (model.path when served_model is set).
        self.aliases = tuple(a for a in aliases if a and a != model)
        # Preflight and the sampling check before the first generation (a config-built backend).
        self.verify = verify
        self.model_note = ""  # which served name preflight settled on, and why
        self.preflighted = False
        self._sampling_ok: set[tuple[float, float, int]] = set()
        self._check_lock = threading.RLock()
        self._lock = threading.Lock()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env, "") if api_key_env else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0)),
            limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        )
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_config(cls, cfg: Config, model: Any = None, tokenizer: Any = None) -> OpenAIBackend:
        """Backend for `cfg.model`; a local model folder also lends its tokenizer for counting."""
        m = cfg.model
        if not isinstance(m.base_url, str):
            raise BackendError(
                "model.base_url lists several endpoints: build the backend with make_backend"
            )
        if tokenizer is None:
            tokenizer = _local_tokenizer(m.path)
        return cls(
            m.base_url,
            m.served_model or m.path,
            api_key_env=m.api_key_env,
            timeout_s=m.request_timeout_s,
            max_retries=m.max_retries,
            concurrency=m.concurrency,
            tokenizer=tokenizer,
            aliases=(m.path,) if m.served_model else (),
            verify=True,
            chat_template_kwargs=cfg.sampling.chat_template_kwargs,
            full_weights=cfg.rsft.full_finetune or not m.lora.enabled,
        )

    @property
    def server_root(self) -> str:
        """The base URL without its `/v1` suffix (vLLM's adapter endpoints hang off the root)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    @property
    def server_label(self) -> str:
        """What the server is, for one-line errors: 'vLLM at http://...'."""
        return f"{SERVER_LABELS[self.server_kind]} at {self.base_url}"

    # ------------------------------------------------------------------ tokens

    def encode(self, messages: Sequence[Message], *, where: str = "prompt") -> Prompt:
        """The chat checked and counted once (the server tokenises it again: that is its own)."""
        msgs = check_messages(messages, where)
        return Prompt(tuple(msgs), self._count(msgs), exact=self.tokenizer is not None)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self._count(check_messages(messages, "prompt"))

    def _count(self, msgs: list[dict[str, str]]) -> int:
        if self.tokenizer is not None:
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        # No tokenizer: about four characters a token, plus a few for each message's framing.
        return sum(math.ceil(len(m["content"]) / 4) + 4 for m in msgs) + 2

    def _estimate_tokens(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return math.ceil(len(text) / 4)

    # -------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        """One request per prompt, `concurrency` at a time; order preserved."""
        check_params(params)
        msgs = [prompt_messages(p, f"prompt {i}") for i, p in enumerate(prompts)]
        if not msgs:
            return []
        if self.verify:
            self._ensure_verified(params)
        return self._generate(msgs, params, [row_seed(p, params, i) for i, p in enumerate(prompts)])

    def _generate(
        self,
        msgs: list[list[dict[str, str]]],
        params: SamplingParams,
        seeds: Sequence[int | None] | None = None,
    ) -> list[Generation]:
        """`seeds`: each request's `seed` (a prompt's own); None: the call's seed plus its index."""
        abort = threading.Event()
        pool = self._executor()
        futures: list[Future[tuple[Generation, int]]] = [
            pool.submit(
                self._complete, i, m, params, abort, seed=None if seeds is None else seeds[i]
            )
            for i, m in enumerate(msgs)
        ]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            exc = f.exception()
            if exc is not None:
                abort.set()
                for other in futures:
                    other.cancel()
                wait(futures)
                if isinstance(exc, Unreachable):
                    raise self._unreachable(str(exc)) from None
                raise exc
        results = [f.result() for f in futures]
        self._raise_on_setup_error(results)
        return [gen for gen, _ in results]

    def _unreachable(self, reason: str) -> BackendError:
        return BackendError(
            f"cannot reach the OpenAI-compatible server at {self.base_url} ({reason}): "
            "is it running? Start one (for example `vllm serve MODEL` or "
            "`transformers serve MODEL`) or fix model.base_url."
        )

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="whale-openai"
                )
            return self._pool

    def _body(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        index: int,
        model: str | None = None,
        seed: int | None = None,
    ) -> dict:
        """The request body; `seed` (a prompt's own) wins over the call's seed plus `index`."""
        body: dict[str, Any] = {
            "model": model or self.active_model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "n": 1,
        }
        if params.min_new_tokens and self.server_kind != "transformers":
            body["min_tokens"] = params.min_new_tokens  # vLLM's field; dropped where refused
        if params.stop:
            body["stop"] = list(params.stop)
        if self.chat_template_kwargs:
            body["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        if self.server_kind == "transformers":
            # `transformers serve` copies temperature and top_p into the model's generation config
            # but only ever switches do_sample off (at temperature 0), refuses top_k and ignores n
            # and logprobs: it samples only when a `generation_config` says do_sample.
            del body["n"]
            body["generation_config"] = json.dumps(_hf_generation_config(params))
        elif params.top_k > 0:
            body["top_k"] = params.top_k  # not in OpenAI's schema; vLLM and others accept it
        if seed is not None:
            body["seed"] = seed
        elif params.seed is not None:
            body["seed"] = params.seed + index  # distinct per prompt: equal prompts, other samples
        if params.logprobs and self.server_kind != "transformers":
            body["logprobs"] = True
            # vLLM: tokens as "token_id:N", so the ids come back exactly (dropped where refused).
            body["return_tokens_as_token_ids"] = True
        with self._lock:
            for name in self.dropped_fields:
                body.pop(name, None)
        return body

    def _complete(
        self,
        index: int,
        messages: list[dict[str, str]],
        params: SamplingParams,
        abort: threading.Event,
        *,
        model: str | None = None,
        retries: int | None = None,
        seed: int | None = None,
    ) -> tuple[Generation, int]:
        """One prompt's completion, and the HTTP status when the server refused it (else 0)."""
        url = f"{self.base_url}/chat/completions"
        body = self._body(messages, params, index, model, seed)
        max_retries = self.max_retries if retries is None else retries
        failure = _Failure("none", "")
        attempt = 0
        while attempt <= max_retries:
            if abort.is_set():
                return Generation("", 0, 0, "error", error="batch aborted"), 0
            if attempt:
                self._sleep_backoff(attempt, abort)
            attempt += 1
            try:
                resp = self._client.post(url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = _Failure("connect", unreachable_reason(exc))
                continue
            except httpx.TimeoutException:
                failure = _Failure("timeout", f"no answer within {self.timeout_s:g} s")
                continue
            except httpx.TransportError as exc:
                failure = _Failure("transport", f"{type(exc).__name__}: {exc}")
                continue
            status = resp.status_code
            if status < 300:
                gen = self._parse(resp, messages, params)
                if isinstance(gen, Generation):
                    return gen, 0
                failure = _Failure("bad_answer", gen)
                continue
            detail = _server_detail(resp)
            if status >= 500 or status in RETRY_STATUSES:
                failure = _Failure("server", f"HTTP {status}: {detail}", status)
                continue
            if status in (400, 422) and self._drop_rejected_field(body, resp.text):
                attempt -= 1  # the request changed; this was not a real attempt
                continue
            error = f"the server refused the request: HTTP {status}: {detail}"
            return Generation("", 0, 0, "error", error=error), status
        if failure.kind == "connect":
            raise Unreachable(failure.detail)
        error = f"{failure.detail} (after {attempt} attempts at {url})"
        return Generation("", 0, 0, "error", error=error), 0

    def _drop_rejected_field(self, body: dict, text: str) -> bool:
        """Drop an optional field the server says it does not accept; True when one was dropped."""
        for name in OPTIONAL_FIELDS:
            if name in body and name in text:
                with self._lock:
                    if name not in self.dropped_fields:
                        log.warning(
                            "server at %s rejects %r; sending requests without it",
                            self.base_url,
                            name,
                        )
                    self.dropped_fields.add(name)
                body.pop(name)
                return True
        return False

    def _sleep_backoff(self, attempt: int, abort: threading.Event) -> None:
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1))
        abort.wait(delay * (0.5 + random.random()))

    def _parse(
        self, resp: httpx.Response, messages: list[dict[str, str]], params: SamplingParams
    ) -> Generation | str:
        """A Generation from a completion, or a string saying what is wrong with the answer."""
        try:
            data = resp.json()
        except ValueError:
            return f"malformed JSON in the answer: {short(resp.text, 120)!r}"
        if not isinstance(data, dict):
            return f"the answer is not a JSON object: {short(str(data), 120)}"
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices:
            return "the answer has no choices"
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            return "the answer's first choice has no message"
        text = message.get("content")
        if text is None:
            text = ""
        if not isinstance(text, str):
            return f"the answer's message content is {type(text).__name__}, not a string"
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        token_ids, token_logprobs = _token_logprobs(choice.get("logprobs"), params)
        if not token_ids:
            raw = choice.get("token_ids")  # vLLM's return_token_ids, when a server sends it
            if isinstance(raw, list) and all(type(t) is int for t in raw):
                token_ids = tuple(raw)
        if params.stop:
            text, hit = cut_at_stop(text, params.stop)
            finish = "stop" if hit else finish
            if hit:  # cut here, not by the server: the ids run past the stop string
                token_ids, token_logprobs = (), ()
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if not isinstance(prompt_tokens, int):
            prompt_tokens = self.count_tokens(messages)
        if not isinstance(completion_tokens, int):
            completion_tokens = self._estimate_tokens(text)
        return Generation(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish,
            token_ids=token_ids,
            token_logprobs=token_logprobs,
        )

    def _raise_on_setup_error(self, results: list[tuple[Generation, int]]) -> None:
        """Every prompt refused with the same 401/403/404: a setup mistake, not a bad prompt."""
        statuses = {status for _, status in results}
        if len(statuses) != 1:
            return
        status = statuses.pop()
        hint = SETUP_STATUSES.get(status)
        if hint:
            detail = results[0][0].error.removeprefix("the server refused the request: ")
            raise BackendError(
                f"the server at {self.base_url} refused every request for model "
                f"{self.active_model!r} ({detail}): {hint.replace('${env}', '$' + self.api_key_env)}"
            )

    # ------------------------------------------------------------ honesty checks

    def _ensure_verified(self, params: SamplingParams) -> None:
        """Preflight once, then the sampling check once per sampling setting, before generating."""
        with self._check_lock:
            if not self.preflighted:
                self.preflight()
            if params.temperature > 0 and sampling_key(params) not in self._sampling_ok:
                self.check_sampling(params)

    def load_adapter(self, path: str | Path, name: str) -> None:
        """Load a LoRA adapter folder into the server under `name`; later requests use it."""
        path = str(path)
        if not name:
            raise BackendError("an adapter needs a name")
        if name in self.adapters:
            self.unload_adapter(name)
        resp = self._adapter_call("load_lora_adapter", {"lora_name": name, "lora_path": path})
        if resp.status_code in (400, 409) and "already" in resp.text.lower():
            # Loaded earlier (by another process or a previous run): replace it with these weights.
            self._adapter_call("unload_lora_adapter", {"lora_name": name})
            resp = self._adapter_call("load_lora_adapter", {"lora_name": name, "lora_path": path})
        if resp.status_code >= 300:
            raise BackendError(
                f"the server at {self.server_root} could not load adapter {name!r} from {path}: "
                f"HTTP {resp.status_code}: {_server_detail(resp)}"
            )
        self.adapters[name] = path
        self.active_model = name
        for old in [a for a in self.adapters if a != name]:
            try:
                self.unload_adapter(old)
            except BackendError as exc:  # the new adapter serves; a leftover only costs memory
                log.warning("could not unload superseded adapter %r: %s", old, exc)

    def load_weights(self, path: str | Path) -> None:
        """Full weights from the safetensors file `path` into every worker of a `vllm serve`
        (through its development endpoint `/collective_rpc` and the `WeightLoader` worker
        extension), then its prefix cache reset; requests go to the base model name."""
        resp = self._adapter_call(
            "collective_rpc",
            {"method": WEIGHT_LOADER_METHOD, "args": [str(path)], "timeout": self.timeout_s},
            root=True,
        )
        if resp.status_code >= 300:
            raise BackendError(
                f"the server at {self.server_root} could not load the weights in {path}: "
                f"HTTP {resp.status_code}: {_server_detail(resp)} ({WEIGHT_LOADER_HINT})"
            )
        try:
            results = resp.json().get("results")
            counts = [int(c) for c in results]
        except (ValueError, TypeError, AttributeError):
            counts = []
        if not counts or min(counts) == 0:
            raise BackendError(
                f"the server at {self.server_root} loaded no tensor from {path} (answer "
                f"{short(resp.text, 120)!r}): {WEIGHT_LOADER_HINT}"
            )
        self._adapter_call("reset_prefix_cache", {}, root=True)
        self.active_model = self.base_model

    def unload_adapter(self, name: str) -> None:
        """Remove an adapter from the server; requests go back to the base model if it was active."""
        resp = self._adapter_call("unload_lora_adapter", {"lora_name": name})
        if resp.status_code >= 300 and not (
            resp.status_code in (400, 404) and name not in self.adapters
        ):
            raise BackendError(
                f"the server at {self.server_root} could not unload adapter {name!r}: "
                f"HTTP {resp.status_code}: {_server_detail(resp)}"
            )
        self.adapters.pop(name, None)
        if self.active_model == name:
            self.active_model = self.base_model

    def _adapter_call(self, endpoint: str, payload: dict, *, root: bool = False) -> httpx.Response:
        """POST to an adapter endpoint (`root`: a development endpoint at the server's root) with
        retries; 404/405 means runtime LoRA (or the development endpoints) is switched off."""
        url = f"{self.server_root}/{endpoint}" if root else f"{self.server_root}/v1/{endpoint}"
        failure = ""
        never = threading.Event()
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._sleep_backoff(attempt, never)
            try:
                resp = self._client.post(url, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = (
                    f"cannot reach the server at {self.server_root} ({unreachable_reason(exc)})"
                )
                continue
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__} talking to {url}: {exc}"
                continue
            if resp.status_code >= 500:
                failure = f"HTTP {resp.status_code} from {url}: {_server_detail(resp)}"
                continue
            if resp.status_code in (404, 405):
                what, hint = (
                    ("full-weight updates", WEIGHT_LOADER_HINT) if root else
                    ("runtime LoRA adapters", ADAPTER_HINT)
                )  # fmt: skip
                raise BackendError(
                    f"the server at {self.server_root} does not support {what} "
                    f"(POST {url.removeprefix(self.server_root)} answered {resp.status_code}): "
                    f"{hint}"
                )
            return resp
        raise BackendError(f"{failure}; is the server running?")

    def close(self) -> None:
        with self._lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
                self._pool = None
        self._client.close()


def _local_tokenizer(path: str) -> Any:
    """The tokenizer of a local model folder, or None (a served model need not exist here)."""
    folder = Path(path).expanduser()
    if not (folder / "tokenizer_config.json").exists():
        return None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder))
    except Exception as exc:  # a broken or partial folder: fall back to the estimate
        log.warning("could not load the tokenizer in %s (%s); estimating token counts", folder, exc)
        return None
    if tok.chat_template is None:
        from whale_lab.presets.common import CHAT_TEMPLATE

        tok.chat_template = CHAT_TEMPLATE
    return tok


def _hf_generation_config(params: SamplingParams) -> dict[str, Any]:
    """The generation config `transformers serve` builds its decoding from (merged over the
    model's own); do_sample is what its temperature field never turns on."""
    lengths: dict[str, Any] = {"max_new_tokens": params.max_new_tokens}
    if params.min_new_tokens:
        lengths["min_new_tokens"] = params.min_new_tokens
    if params.greedy:
        return {"do_sample": False, **lengths}
    return {
        "do_sample": True,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,  # 0 switches the filter off, as in the hf backend
        **lengths,
    }


def _token_logprobs(data: Any, params: SamplingParams) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Sampled ids and their log-probabilities from a choice's `logprobs`, when every token came
    back as vLLM's "token_id:N"; both empty otherwise (the caller reports 'unverified')."""
    if not params.logprobs or not isinstance(data, dict):
        return (), ()
    content = data.get("content")
    if not isinstance(content, list) or not content:
        return (), ()
    ids: list[int] = []
    lps: list[float] = []
    for entry in content:
        if not isinstance(entry, dict):
            return (), ()
        match = _TOKEN_ID.fullmatch(str(entry.get("token", "")))
        lp = entry.get("logprob")
        if match is None or isinstance(lp, bool) or not isinstance(lp, (int, float)):
            return (), ()
        ids.append(int(match.group(1)))
        lps.append(float(lp))
    return tuple(ids), tuple(lps)
