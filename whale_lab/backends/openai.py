"""Generation through an OpenAI-compatible `/chat/completions` server (vLLM, `transformers serve`, ...).

A batch becomes one request per prompt, sent by a pool of `concurrency` threads over one HTTP client.
Timeouts, dropped connections, 429 and 5xx answers are retried with exponential backoff and jitter;
other 4xx answers are not. A server that cannot be reached fails the whole batch with a
`BackendError` that says what to do; a prompt whose answers stay unusable (bad JSON, no choices,
timeouts) gets `Generation(finish_reason="error")` so that one bad prompt never sinks the batch.

Adapters: `load_adapter(path, name)` uses vLLM's runtime LoRA endpoint, after which requests name the
adapter as their model, so harness search sees the weights RSFT just trained.
"""

from __future__ import annotations

import logging
import math
import os
import random
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
    SamplingParams,
    check_messages,
    check_params,
    cut_at_stop,
)

if TYPE_CHECKING:
    from whale_lab.config import Config

log = logging.getLogger(__name__)

# Request fields that some servers reject (`transformers serve` refuses top_k, a few refuse seed).
# When a 400/422 names one, it is dropped for the rest of the backend's life and the request resent.
OPTIONAL_FIELDS = ("top_k", "seed")
# Statuses that say "the request was fine, ask again later".
RETRY_STATUSES = frozenset({408, 409, 425, 429})
# 4xx statuses that, when every prompt of a batch gets them, mean the setup is wrong.
SETUP_STATUSES = {
    401: "the server wants an API key: put it in ${env} (model.api_key_env)",
    403: "the API key in ${env} (model.api_key_env) may not use this model",
    404: "check model.base_url (it usually ends in /v1) and model.served_model "
    "(the name the server serves)",
}

ADAPTER_HINT = (
    "start vLLM with --enable-lora (and --max-lora-rank at least the adapter's rank) and the "
    "environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


class _Unreachable(Exception):
    """The server could not be reached at all (connection refused, DNS, connect timeout)."""


@dataclass
class _Failure:
    """Why the last attempt of one request failed."""

    kind: str  # "connect" | "timeout" | "transport" | "server" | "bad_answer" | "client"
    detail: str
    status: int = 0


def _unreachable_reason(exc: Exception) -> str:
    text = str(exc).lower()
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout"
    if "refused" in text or "errno 111" in text or "errno 61" in text:
        return "connection refused"
    if "name or service" in text or "nodename" in text or "getaddrinfo" in text:
        return "host name not found"
    return str(exc) or type(exc).__name__


def _short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _server_detail(resp: httpx.Response) -> str:
    """The server's own error message, whatever shape its JSON error takes."""
    try:
        data = resp.json()
    except ValueError:
        return _short(resp.text or resp.reason_phrase)
    if isinstance(data, dict):
        for key in ("detail", "message", "error"):
            val = data.get(key)
            if isinstance(val, dict):
                val = val.get("message", val)
            if val:
                return _short(str(val))
    return _short(str(data))


class OpenAIBackend:
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
        self.dropped_fields: set[str] = set()
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
        )

    @property
    def server_root(self) -> str:
        """The base URL without its `/v1` suffix (vLLM's adapter endpoints hang off the root)."""
        return self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url

    # ------------------------------------------------------------------ tokens

    def count_tokens(self, messages: Sequence[Message]) -> int:
        msgs = check_messages(messages, "prompt")
        if self.tokenizer is not None:
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False
            )
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        # No tokenizer: about four characters a token, plus a few for each message's framing.
        return sum(math.ceil(len(m["content"]) / 4) + 4 for m in msgs) + 2

    def _estimate_tokens(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return math.ceil(len(text) / 4)

    # -------------------------------------------------------------- generation

    def generate(
        self, prompts: Sequence[Sequence[Message]], params: SamplingParams
    ) -> list[Generation]:
        """One request per prompt, `concurrency` at a time; order preserved."""
        check_params(params)
        msgs = [check_messages(p, f"prompt {i}") for i, p in enumerate(prompts)]
        if not msgs:
            return []
        abort = threading.Event()
        pool = self._executor()
        futures: list[Future[tuple[Generation, int]]] = [
            pool.submit(self._complete, i, m, params, abort) for i, m in enumerate(msgs)
        ]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            exc = f.exception()
            if exc is not None:
                abort.set()
                for other in futures:
                    other.cancel()
                wait(futures)
                if isinstance(exc, _Unreachable):
                    raise BackendError(
                        f"cannot reach the OpenAI-compatible server at {self.base_url} ({exc}): "
                        "is it running? Start one (for example `vllm serve MODEL` or "
                        "`transformers serve MODEL`) or fix model.base_url."
                    ) from None
                raise exc
        results = [f.result() for f in futures]
        self._raise_on_setup_error(results)
        return [gen for gen, _ in results]

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    max_workers=self.concurrency, thread_name_prefix="whale-openai"
                )
            return self._pool

    def _body(self, messages: list[dict[str, str]], params: SamplingParams, index: int) -> dict:
        body: dict[str, Any] = {
            "model": self.active_model,
            "messages": messages,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "n": 1,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.top_k > 0:
            body["top_k"] = params.top_k  # not in OpenAI's schema; vLLM and others accept it
        if params.seed is not None:
            body["seed"] = params.seed + index  # distinct per prompt: equal prompts, other samples
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
    ) -> tuple[Generation, int]:
        """One prompt's completion, and the HTTP status when the server refused it (else 0)."""
        url = f"{self.base_url}/chat/completions"
        body = self._body(messages, params, index)
        failure = _Failure("none", "")
        attempt = 0
        while attempt <= self.max_retries:
            if abort.is_set():
                return Generation("", 0, 0, "error", error="batch aborted"), 0
            if attempt:
                self._sleep_backoff(attempt, abort)
            attempt += 1
            try:
                resp = self._client.post(url, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = _Failure("connect", _unreachable_reason(exc))
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
            raise _Unreachable(failure.detail)
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
            return f"malformed JSON in the answer: {_short(resp.text, 120)!r}"
        if not isinstance(data, dict):
            return f"the answer is not a JSON object: {_short(str(data), 120)}"
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
        if params.stop:
            text, hit = cut_at_stop(text, params.stop)
            finish = "stop" if hit else finish
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

    # ----------------------------------------------------------------- adapters

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

    def _adapter_call(self, endpoint: str, payload: dict) -> httpx.Response:
        """POST to an adapter endpoint with retries; 404/405 means runtime LoRA is switched off."""
        url = f"{self.server_root}/v1/{endpoint}"
        failure = ""
        never = threading.Event()
        for attempt in range(self.max_retries + 1):
            if attempt:
                self._sleep_backoff(attempt, never)
            try:
                resp = self._client.post(url, json=payload)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = (
                    f"cannot reach the server at {self.server_root} ({_unreachable_reason(exc)})"
                )
                continue
            except httpx.TransportError as exc:
                failure = f"{type(exc).__name__} talking to {url}: {exc}"
                continue
            if resp.status_code >= 500:
                failure = f"HTTP {resp.status_code} from {url}: {_server_detail(resp)}"
                continue
            if resp.status_code in (404, 405):
                raise BackendError(
                    f"the server at {self.server_root} does not support runtime LoRA adapters "
                    f"(POST /v1/{endpoint} answered {resp.status_code}): {ADAPTER_HINT}"
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
