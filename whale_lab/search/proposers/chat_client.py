"""The LLM proposer's HTTP client: one chat completion at a time, inside budgets that hold.

What it guarantees, and how:

- **One deadline per request, body included.** Each attempt runs in a worker thread that streams
  the response and checks the wall clock after every chunk; the caller waits on the worker only
  until the attempt's deadline (the sooner of `request_timeout_s` and the session's deadline), so a
  server that trickles one byte every half second cannot stretch a request, or the session, past
  it. A per-read socket timeout alone would not do: every trickled byte resets it.
- **A timed-out request is cancelled, not stacked.** Connections are never kept alive, so each
  request has its own TCP connection; when an attempt times out, that socket is shut down, which
  ends the worker at once and tells the server the client has gone (servers that watch for a
  disconnect, such as vLLM, stop generating). `concurrency` bounds the requests in flight
  *including abandoned ones still winding down*: with the default of 1 no new request is sent
  before the abandoned one's worker has ended.
- **Back-off that waits for the server to be free.** After a timeout the client does not simply
  sleep and resend: it polls `GET <base_url>/models` (cheap on every OpenAI-compatible server) and
  resends only once the server answers it within `probe_timeout_s`, because a one-worker server
  (`transformers serve`) may still be generating the abandoned reply. Any HTTP answer counts, even
  404/501, since only a prompt answer matters. Other faults (5xx, 429, malformed JSON, empty
  choices, a refused connection) back off exponentially from `backoff_s`, within the deadline.
- **Size caps both ways.** A request body over `MAX_REQUEST_BYTES` is refused before it is sent
  (`RequestTooLarge`); a response body over `MAX_RESPONSE_BYTES` ends the attempt without retry.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

MAX_REQUEST_BYTES = 4_000_000
MAX_RESPONSE_BYTES = 8_000_000
PROBE_TIMEOUT_S = 2.0


class ProposerHTTPError(RuntimeError):
    """The endpoint kept failing after retries, or the deadline came first."""


class RequestTooLarge(ProposerHTTPError):
    """The conversation outgrew the request size cap; sending it would only fail slower."""


@dataclass
class _Attempt:
    """One POST in its worker thread; the caller reads it only after `done` is set."""

    until: float
    done: threading.Event = field(default_factory=threading.Event)
    cancel: threading.Event = field(default_factory=threading.Event)
    status: int = 0
    body: bytes = b""
    error: str = ""
    kind: str = ""  # "" ok, "timeout", "transport", "too_large"
    sock: socket.socket | None = None

    def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep the request's socket, so a timeout can shut it down."""
        if name == "connection.connect_tcp.complete":
            stream = info.get("return_value")
            try:
                sock = stream.get_extra_info("socket") if stream is not None else None
            except Exception:  # noqa: BLE001 - a backend without sockets: abandon instead
                sock = None
            if isinstance(sock, socket.socket):
                self.sock = sock

    def shutdown(self) -> None:
        self.cancel.set()
        sock = self.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class ChatClient:
    """POST `/chat/completions` with retries, under one deadline per request and per session."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: dict[str, str] | None = None,
        request_timeout_s: float = 120.0,
        max_retries: int = 3,
        concurrency: int = 1,
        backoff_s: float = 1.0,
        probe_timeout_s: float = PROBE_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/chat/completions"
        self.request_timeout_s = float(request_timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.probe_timeout_s = float(probe_timeout_s)
        self._slots = threading.BoundedSemaphore(max(1, int(concurrency)))
        self._client = httpx.Client(
            headers={"Content-Type": "application/json", **(headers or {})},
            transport=transport,
            limits=httpx.Limits(max_keepalive_connections=0),
        )
        self.abandoned = 0  # attempts given up at their deadline, their connection closed

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ one request
    def complete(
        self,
        payload: dict[str, Any],
        deadline: float,
        log: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """A chat completion as a dict with `choices`; raises ProposerHTTPError when it fails."""
        body = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        if len(body) > MAX_REQUEST_BYTES:
            raise RequestTooLarge(
                f"request size cap: the conversation is {len(body):,} bytes "
                f"(at most {MAX_REQUEST_BYTES:,})"
            )
        last = ""
        attempts = self.max_retries + 1
        attempt = 0
        for attempt in range(attempts):
            if time.monotonic() >= deadline:
                raise ProposerHTTPError(
                    f"wall-time budget spent while calling {self.url}"
                    + (f" (last error: {last})" if last else "")
                )
            until = min(deadline, time.monotonic() + self.request_timeout_s)
            data, last, retry, timed_out = self._attempt(body, until)
            if data is not None:
                return data
            if log is not None:
                log(f"attempt {attempt + 1} failed: {last}")
            if not retry:
                break
            if attempt + 1 < attempts:
                if timed_out:
                    self._wait_until_free(deadline)
                else:
                    pause = self.backoff_s * (2**attempt)
                    time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        raise ProposerHTTPError(
            f"{self.url}: {last} (after {attempt + 1} attempt{'s' if attempt else ''})"
        )

    def _attempt(self, body: bytes, until: float) -> tuple[dict[str, Any] | None, str, bool, bool]:
        """(data, error, retry?, timed out?) of one POST that ends by `until`, whatever the server."""
        budget = until - time.monotonic()
        if not self._slots.acquire(timeout=max(0.0, budget)):
            return None, "the endpoint is still busy with an abandoned request", True, True
        att = _Attempt(until=until)
        worker = threading.Thread(target=self._post, args=(att, body), daemon=True)
        try:
            worker.start()
        except BaseException:
            self._slots.release()
            raise
        att.done.wait(timeout=max(0.0, until - time.monotonic()) + 0.05)
        if not att.done.is_set():
            att.shutdown()
            self.abandoned += 1
            return None, f"timed out after {budget:.1f}s (request abandoned)", True, True
        if att.kind == "timeout":
            self.abandoned += 1
            return None, f"timed out after {budget:.1f}s", True, True
        if att.kind == "transport":
            return None, f"cannot reach {self.url}: {att.error}", True, False
        if att.kind == "too_large":
            return None, att.error, False, False
        text = att.body.decode("utf-8", errors="replace")
        if att.status >= 500 or att.status == 429:
            return None, f"HTTP {att.status}: {text[:200]}", True, False
        if att.status >= 400:
            return None, f"HTTP {att.status}: {text[:300]}", False, False
        try:
            data = json.loads(text)
        except ValueError:
            return None, f"malformed JSON in the response: {text[:120]!r}", True, False
        if not isinstance(data, dict):
            return None, "the response is not a JSON object", True, False
        if not data.get("choices"):
            return None, "the response has no choices", True, False
        return data, "", False, False

    def _post(self, att: _Attempt, body: bytes) -> None:
        """The worker: stream the reply, stop at the deadline, the size cap or a cancel."""
        try:
            left = max(0.001, att.until - time.monotonic())
            timeout = httpx.Timeout(left, connect=min(left, 10.0))
            with self._client.stream(
                "POST", self.url, content=body, timeout=timeout, extensions={"trace": att.trace}
            ) as resp:
                buf = bytearray()
                for chunk in resp.iter_bytes():
                    if att.cancel.is_set():
                        return
                    if time.monotonic() > att.until:
                        att.kind = "timeout"
                        return
                    buf += chunk
                    if len(buf) > MAX_RESPONSE_BYTES:
                        att.kind = "too_large"
                        att.error = (
                            f"response size cap: the reply is over {MAX_RESPONSE_BYTES:,} bytes"
                        )
                        return
                att.status = resp.status_code
                att.body = bytes(buf)
        except httpx.TimeoutException:
            att.kind = "timeout"
        except (httpx.TransportError, httpx.StreamError) as exc:
            att.kind = "timeout" if att.cancel.is_set() else "transport"
            att.error = str(exc) or type(exc).__name__
        except Exception as exc:  # noqa: BLE001 - reported to the caller, never raised in a thread
            att.kind = "transport"
            att.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._slots.release()
            att.done.set()

    # ------------------------------------------------------------------ back-off
    def _wait_until_free(self, deadline: float) -> bool:
        """Poll `/models` until the server answers promptly (True) or the deadline passes."""
        pause = max(0.0, self.backoff_s)
        while True:
            time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self._client.get(
                    self.base_url + "/models", timeout=min(self.probe_timeout_s, left)
                )
                return True
            except httpx.TimeoutException:
                pause = min(max(pause * 2, 0.05), 5.0)
            except httpx.HTTPError:
                return True  # down or refusing: the retry itself reports it
