"""Test servers: a real `transformers serve` subprocess and a scriptable fault-injecting HTTP server.

`TransformersServer` runs `transformers serve` offline on a free 127.0.0.1 port and returns once
`/health` answers and the given model folder is loaded; it speaks the OpenAI chat API for real. `FaultServer` is a tiny
`http.server` in a thread whose answers a test scripts: per path, a queue of `Reply`s (status,
body, delay, a dropped connection) and a default; every request is recorded for assertions.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

# ----------------------------------------------------------------- helpers


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def refused_url() -> str:
    """A base URL where every connection is refused (no server listens there)."""
    return f"http://127.0.0.1:{free_port()}/v1"


def chat_completion(
    text: str = "ok",
    *,
    model: str = "test-model",
    finish_reason: str = "stop",
    prompt_tokens: int | None = 7,
    completion_tokens: int | None = 3,
) -> dict[str, Any]:
    """An OpenAI `chat.completion` object; `None` token counts leave `usage` out."""
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
    }
    if prompt_tokens is not None and completion_tokens is not None:
        body["usage"] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
    return body


def spread_weights(model: Any, seed: int = 1, std: float = 0.3) -> Any:
    """Redraw a tiny random model's matrices with a wider spread, in place.

    The stock tiny model (init std 0.02) only ever repeats its last token, whatever the prompt, so
    tests that compare outputs would pass vacuously; with std 0.3 the output depends on the prompt.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


# ------------------------------------------------------------ fault server


@dataclass(frozen=True)
class Reply:
    """One scripted answer. `body` may be a dict (sent as JSON), str/bytes (sent raw) or None."""

    status: int = 200
    body: dict | list | str | bytes | None = None
    delay_s: float = 0.0
    drop: bool = False  # close the connection without answering
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def ok(cls, text: str = "ok", **kw: Any) -> Reply:
        return cls(200, chat_completion(text, **kw))

    @classmethod
    def error(cls, status: int = 500, message: str = "internal error") -> Reply:
        return cls(status, {"error": {"message": message, "code": status}})

    @classmethod
    def delayed(cls, seconds: float, then: Reply | None = None) -> Reply:
        base = then or cls.ok("late")
        return cls(base.status, base.body, seconds, base.drop, base.headers)

    @classmethod
    def malformed(cls) -> Reply:
        return cls(
            200,
            '{"choices": [{"message": {"content": "trunc',
            headers=(("Content-Type", "application/json"),),
        )

    @classmethod
    def empty_choices(cls) -> Reply:
        return cls(200, {"id": "x", "object": "chat.completion", "choices": []})

    @classmethod
    def dropped(cls) -> Reply:
        return cls(drop=True)


@dataclass
class Request:
    """A request as the fault server saw it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


Responder = Callable[[Request], Reply]


def echo_responder(req: Request) -> Reply:
    """Default answer: a completion that echoes the last message, or `{}` for other paths."""
    if req.path.endswith("/chat/completions") and req.method == "POST":
        data = req.json or {}
        msgs = data.get("messages") or [{}]
        text = f"echo: {msgs[-1].get('content', '')}"
        return Reply.ok(text, model=str(data.get("model", "test-model")))
    return Reply(200, {})


@dataclass
class FaultServer:
    """A threaded HTTP server whose answers are scripted per path; use as a context manager.

    `script(path, *replies)` queues replies for requests whose path ends with `path` (consumed in
    order); when a path's queue is empty the `default` responder answers. `requests` records all.
    """

    default: Responder = echo_responder
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._queues: dict[str, collections.deque[Reply]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting
    def script(self, path: str, *replies: Reply) -> FaultServer:
        with self._lock:
            self._queues.setdefault(path, collections.deque()).extend(replies)
        return self

    def set_default(self, responder: Responder | Reply) -> FaultServer:
        self.default = responder if callable(responder) else (lambda _req, r=responder: r)
        return self

    def requests_to(self, path: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith(path)]

    def _next_reply(self, req: Request) -> Reply:
        with self._lock:
            self.requests.append(req)
            for path, queue in self._queues.items():
                if req.path.endswith(path) and queue:
                    return queue.popleft()
        return self.default(req)

    # -- lifecycle
    @property
    def url(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> FaultServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # keep test output clean

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Request(self.command, self.path, dict(self.headers.items()), body)
                reply = server._next_reply(req)
                if reply.delay_s and server._stop.wait(reply.delay_s):
                    return
                if reply.drop:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if isinstance(reply.body, (dict, list)):
                    payload = json.dumps(reply.body).encode()
                    ctype = "application/json"
                elif isinstance(reply.body, str):
                    payload, ctype = reply.body.encode(), "text/plain"
                else:
                    payload, ctype = reply.body or b"", "application/octet-stream"
                try:
                    self.send_response(reply.status)
                    headers = dict(reply.headers)
                    headers.setdefault("Content-Type", ctype)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test): nothing to answer

            do_GET = _handle
            do_POST = _handle
            do_PUT = _handle
            do_DELETE = _handle

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fault-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ------------------------------------------------------ transformers serve


def transformers_cli() -> list[str]:
    """The command that runs the `transformers` CLI of this interpreter's environment."""
    exe = Path(sys.executable).with_name("transformers")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("transformers")
    if found:
        return [found]
    return [sys.executable, "-c", "from transformers.cli.transformers import main; main()"]


@dataclass
class TransformersServer:
    """`transformers serve` for local model folders, offline, on 127.0.0.1; a context manager.

    Requests name a model by its folder path. `model_dir` is loaded before `start()` returns (one
    warm-up request). Unpinned (the default), the server also loads any other local folder a
    request names, and never unloads one; `pin=True` serves `model_dir` only (`force_model`).
    The server's output goes to a log file (`.log_path`), shown when start-up fails.
    """

    model_dir: str | Path
    port: int = 0
    pin: bool = False
    startup_timeout_s: float = 120.0
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model = str(self.model_dir)
        self.port = self.port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._cmd: list[str] = []
        self._launched_at = 0.0
        self._ready = False
        self.log_path = Path(tempfile.mkdtemp(prefix="tserve-")) / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def start(self) -> TransformersServer:
        """Launch the server and wait until it answers with the model loaded."""
        return self.launch().wait_ready()

    def launch(self) -> TransformersServer:
        """Start the process and return at once (so start-up overlaps other work)."""
        if self.proc is not None:
            return self
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
            **self.env,
        }
        cmd = [
            *transformers_cli(), "serve", *([self.model] if self.pin else []),
            "--host", "127.0.0.1", "--port", str(self.port),
            "--device", "cpu", "--dtype", "float32", "--log-level", "error",
            "--model-timeout", "-1",
            *self.extra_args,
        ]  # fmt: skip
        log = self.log_path.open("wb")
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
            )
        finally:
            log.close()
        self._cmd = cmd
        self._launched_at = time.monotonic()
        return self

    def wait_ready(self) -> TransformersServer:
        """Block until `/health` answers and the model is loaded; RuntimeError with the log if not."""
        if self.proc is None:
            self.launch()
        assert self.proc is not None
        if self._ready:
            return self
        deadline = self._launched_at + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"`{' '.join(self._cmd)}` exited with {self.proc.returncode}:\n"
                    f"{self.log_tail()}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    self._warm_up(deadline - time.monotonic())
                    self._ready = True
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        message = (
            f"`transformers serve` was not ready after {self.startup_timeout_s:g} s:\n"
            f"{self.log_tail()}"
        )
        self.stop()
        raise RuntimeError(message)

    def _warm_up(self, timeout_s: float) -> None:
        """Load the model now, so that the first test does not pay for it."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        resp = httpx.post(self.base_url + "/chat/completions", json=body, timeout=max(timeout_s, 1))
        if resp.status_code != 200:
            message = (
                f"`transformers serve` could not load {self.model}: HTTP {resp.status_code} "
                f"{resp.text[:300]}\n{self.log_tail()}"
            )
            self.stop()
            raise RuntimeError(message)

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop the process and remove its log folder (failures already quoted its tail)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.log_path.parent, ignore_errors=True)

    def __enter__(self) -> TransformersServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def judge_responder(req: Request) -> Reply:
    """A judge endpoint: CORRECT when a reference answer appears in the predicted answer, as an
    LLM judge would rule on a paraphrase; other paths get `{}`."""
    if not (req.path.endswith("/chat/completions") and req.method == "POST"):
        return Reply(200, {})
    user = str(((req.json or {}).get("messages") or [{}])[-1].get("content", ""))
    refs = [line[2:].strip().lower() for line in user.splitlines() if line.startswith("- ")]
    predicted = user.rsplit("Predicted answer:", 1)[-1].strip().lower()
    verdict = "CORRECT" if any(r and r in predicted for r in refs) else "INCORRECT"
    return Reply.ok(verdict, prompt_tokens=40, completion_tokens=1)
