"""The engine's side of the harness host: start the sandboxed process, batch calls, survive failures.

`HarnessHost(path, domain, sandbox)` starts `python -m whale_lab.harness.host_main` with resource
limits, a clean environment and a temporary working folder, and loads the harness file there. Where
the machine allows it the host runs confined by the operating system (`whale_lab.confine`: bwrap with
no network, its own PID namespace, a read-only view holding only Python, its standard library and
the host's own modules, and a private /tmp); otherwise with resource limits only, after a warning,
or not at all unless `[sandbox] allow_unconfined` is true. A load problem raises
`HarnessLoadError` naming the file, the line and the reason.

`render`, `parse` and `call` send a whole batch in one round trip; results stream back one per call.
Each call has a deadline. A call that misses it (a hang inside C code, an alarm the harness
swallowed) is marked "timeout"; a call during which the host dies is marked "crashed" (or "memory").
The host is then killed if needed, restarted, and the rest of the batch resent, so a bad harness
costs only its own episodes. Only task fields, histories and contexts cross into the host: never
reference answers or verifiers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from whale_lab import confine
from whale_lab.config import SandboxConfig
from whale_lab.errors import WhaleLabError
from whale_lab.harness.surfaces import ALLOWED_IMPORTS

CallKind = Literal[
    "ok", "exception", "timeout", "memory", "crashed", "bad_type", "output_flood", "missing"
]

# The host process's module: it and what it imports are all of the project a confined host sees.
HOST_ENTRY = "whale_lab.harness.host_main"

# Output past this many times the kept cap is a flood: the call is stopped.
FLOOD_FACTOR = 50
FLOOD_MIN_CHARS = 1_000_000


class HarnessLoadError(WhaleLabError):
    """The harness file cannot be used; the message names the file, the line and the reason."""

    def __init__(self, path: str | Path, line: int, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        where = f"{self.path}:{line}" if line else self.path
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class HarnessInfo:
    """What the engine needs to know about a loaded harness."""

    path: str
    name: str
    sha: str  # sha256 of the file's text
    max_turns: int
    format_retry_budget: int
    illegal_move_retry_budget: int
    stop_sequences: tuple[str, ...]
    constants: Mapping[str, Any] = field(default_factory=dict)  # upper-case str/int/tuple values
    system_prompt: str = ""
    user_prompt: str = ""
    functions: tuple[str, ...] = ()  # functions the module defines
    surfaces: tuple[str, ...] = ()  # surfaces the module overrides (the rest are defaults)
    domain: str = ""


@dataclass(frozen=True)
class CallResult:
    """The outcome of one harness call; `kind` says how it went when `ok` is false."""

    ok: bool
    value: Any = None
    error: str = ""
    kind: CallKind = "ok"
    output: str = ""  # what the harness printed during the call (capped)
    line: int = 0  # harness line of an exception, when known


@dataclass(frozen=True)
class RenderRequest:
    fields: Mapping[str, Any]
    history: Sequence[Mapping[str, Any]]
    context: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParseRequest:
    response: str
    context: Mapping[str, Any] = field(default_factory=dict)


class _Deadline(Exception):
    pass


class _HostGone(Exception):
    pass


def harness_name(path: str | Path) -> str:
    """A short name: the file stem, or the folder's name for archive files called harness.py."""
    p = Path(path)
    if p.stem == "harness" and p.parent.name:
        return p.parent.name
    return p.stem


def _package_root() -> str:
    return str(Path(__file__).resolve().parents[2])


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


class HarnessHost:
    """A harness file loaded in its own sandboxed process; batched calls with per-call deadlines."""

    def __init__(
        self,
        path: str | Path,
        domain: Any = "",
        sandbox: SandboxConfig = SandboxConfig(),  # noqa: B008 - frozen, safe as a default
        *,
        allowed_imports: Sequence[str] | None = None,
        timeout_budget_s: float | None = None,
        load_timeout_s: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.domain = domain if isinstance(domain, str) else str(getattr(domain, "name", ""))
        self.sandbox = sandbox
        self.allowed_imports = tuple(allowed_imports or sorted(ALLOWED_IMPORTS))
        # Time a batch may lose to timed-out calls before its remaining calls are not run at all.
        self.timeout_budget_s = (
            timeout_budget_s
            if timeout_budget_s is not None
            else max(10.0, 5 * sandbox.call_timeout_s)
        )
        self.load_timeout_s = (
            load_timeout_s if load_timeout_s is not None else max(10.0, 5 * sandbox.call_timeout_s)
        )
        self.restarts = 0
        self.failures: Counter[str] = Counter()
        self._proc: subprocess.Popen[bytes] | None = None
        self._wfd = -1
        self._rfd = -1
        self._buf = bytearray()
        self._lock = threading.RLock()
        self._closed = False
        self._tmp = ""
        try:
            self.source = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise HarnessLoadError(self.path, 0, "harness file not found") from None
        except IsADirectoryError:
            raise HarnessLoadError(self.path, 0, "expected a Python file, got a folder") from None
        except UnicodeDecodeError as exc:
            raise HarnessLoadError(self.path, 0, f"not UTF-8 text ({exc.reason})") from None
        self.sha = hashlib.sha256(self.source.encode("utf-8")).hexdigest()
        # Raises ConfinementError when confinement is required and this machine cannot confine.
        self.confinement = confine.enforce(sandbox.allow_unconfined, "harness code")
        self._tmp = tempfile.mkdtemp(prefix="whale-harness-")
        try:
            raw = self._start()
        except BaseException:
            self.close()
            raise
        self.load_output = str(raw.get("output", ""))
        info = raw["info"]
        self.info = HarnessInfo(
            path=str(self.path),
            name=harness_name(self.path),
            sha=self.sha,
            max_turns=int(info["max_turns"]),
            format_retry_budget=int(info["format_retry_budget"]),
            illegal_move_retry_budget=int(info["illegal_move_retry_budget"]),
            stop_sequences=tuple(info["stop_sequences"]),
            constants={
                k: tuple(v) if isinstance(v, list) else v for k, v in info["constants"].items()
            },
            system_prompt=str(info["system_prompt"]),
            user_prompt=str(info["user_prompt"]),
            functions=tuple(info["functions"]),
            surfaces=tuple(info["surfaces"]),
            domain=self.domain,
        )

    # -------------------------------------------------------------- process management

    @property
    def pid(self) -> int | None:
        """The host process id (None while no host runs)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def _call_deadline_s(self) -> float:
        """Client-side limit per call: the host's own alarm plus room for scheduling delays."""
        t = self.sandbox.call_timeout_s
        return t * 1.5 + 1.0

    def _command(self, req_r: int, resp_w: int) -> list[str]:
        """The host's own command line (confined: the real interpreter, no site-packages)."""
        if self.confinement.confined:
            cmd = [confine.python_executable(), "-S", "-s", "-B"]
        else:
            cmd = [sys.executable, "-s", "-B"]
        if sys.version_info >= (3, 11):
            cmd.append("-P")
        return cmd + [
            "-m",
            HOST_ENTRY,
            "--in",
            str(req_r),
            "--out",
            str(resp_w),
            "--memory-mb",
            str(self.sandbox.memory_mb),
            "--cpu-seconds",
            str(self.sandbox.cpu_seconds),
        ]

    def _env(self) -> dict[str, str]:
        if self.confinement.confined:
            return confine.clean_env({"PYTHONPATH": confine.PACKAGE_ROOT})
        return {
            "PATH": os.defpath,
            "PYTHONPATH": _package_root(),
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONHASHSEED": "0",
            "LC_ALL": "C.UTF-8",
            "LANG": "C.UTF-8",
            "HOME": self._tmp,
            "TMPDIR": self._tmp,
        }

    @property
    def _stderr_path(self) -> str:
        return os.path.join(self._tmp, "host.stderr")

    def _start(self) -> dict[str, Any]:
        """Start a host and load the harness; returns the load reply or raises HarnessLoadError."""
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        wrapped: confine.Wrapped | None = None
        try:
            argv, fds = self._command(req_r, resp_w), (req_r, resp_w)
            if self.confinement.confined:
                wrapped = confine.wrap(
                    argv,
                    bwrap=self.confinement.bwrap,
                    env=self._env(),
                    binds=confine.module_binds(HOST_ENTRY),
                )
                argv, fds = wrapped.argv, fds + wrapped.pass_fds
            with open(self._stderr_path, "wb") as err:
                self._proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    pass_fds=fds,
                    cwd=self._tmp,
                    env=self._env(),
                    start_new_session=True,
                    close_fds=True,
                )
        except BaseException:
            for fd in (req_w, resp_r):
                os.close(fd)
            raise
        finally:
            os.close(req_r)
            os.close(resp_w)
            if wrapped is not None:
                wrapped.close()
        self._wfd, self._rfd = req_w, resp_r
        self._buf = bytearray()
        os.set_blocking(self._wfd, False)
        # poll, not select: no limit on descriptor numbers in a process with many files open
        self._rpoll = select.poll()
        self._rpoll.register(self._rfd, select.POLLIN)
        self._wpoll = select.poll()
        self._wpoll.register(self._wfd, select.POLLOUT)
        limits = {
            "op": "load",
            "source": self.source,
            "path": str(self.path),
            "domain": self.domain,
            "allowed_imports": list(self.allowed_imports),
            "call_timeout_s": self.sandbox.call_timeout_s,
            "load_timeout_s": self.load_timeout_s,
            "max_output_chars": self.sandbox.max_output_chars,
            "flood_chars": max(FLOOD_MIN_CHARS, FLOOD_FACTOR * self.sandbox.max_output_chars),
        }
        deadline = time.monotonic() + self.load_timeout_s + 60.0
        try:
            self._send(json.dumps(limits, ensure_ascii=False).encode("utf-8"), deadline)
            msg = self._read_message(deadline)
        except _Deadline:
            self._kill()
            raise HarnessLoadError(self.path, 0, "the harness host did not start in time") from None
        except _HostGone:
            msg = None
        if msg is None:
            _, reason = self._death_reason()
            self._kill()
            raise HarnessLoadError(self.path, 0, f"the harness host failed to start: {reason}")
        if msg.get("type") == "load_error":
            self._kill()
            raise HarnessLoadError(self.path, int(msg.get("line") or 0), str(msg.get("reason")))
        return msg

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        self._start()

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        for fd in (self._wfd, self._rfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._wfd = self._rfd = -1
        self._buf = bytearray()
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                with contextlib.suppress(OSError):
                    proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    def _stderr_tail(self, limit: int = 2000) -> str:
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - limit))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def _death_reason(self) -> tuple[CallKind, str]:
        """Why the host died: ("memory" | "timeout" | "crashed", readable reason)."""
        proc = self._proc
        rc = None
        if proc is not None:
            try:
                rc = proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                rc = None
        tail = self._stderr_tail()
        last = tail.splitlines()[-1] if tail else ""
        if any(s in tail for s in ("MemoryError", "Cannot allocate memory", "out of memory")):
            return (
                "memory",
                f"the harness host ran out of memory (limit {self.sandbox.memory_mb} MB)",
            )
        if rc is None:
            return "crashed", "the harness host stopped answering"
        sig = confine.exit_signal(rc, self.confinement.confined)
        if sig is not None:
            if sig == getattr(signal, "SIGXCPU", -1):
                return "timeout", (
                    f"the harness host used up its CPU-time limit ({self.sandbox.cpu_seconds}s)"
                )
            if sig == signal.SIGKILL:
                return "crashed", (
                    "the harness host was killed (SIGKILL; possibly the system's "
                    "out-of-memory killer)"
                )
            return "crashed", f"the harness host died with {_signal_name(sig)}"
        detail = f": {last}" if last else ""
        return "crashed", f"the harness host exited with status {rc}{detail}"

    # -------------------------------------------------------------- pipe I/O

    def _send(self, data: bytes, deadline: float) -> None:
        view = memoryview(data + b"\n")
        while view:
            try:
                n = os.write(self._wfd, view)
            except BlockingIOError:
                n = 0
            except (BrokenPipeError, OSError):
                raise _HostGone() from None
            view = view[n:]
            if view:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _Deadline()
                self._wpoll.poll(remaining * 1000)

    def _read_message(self, deadline: float) -> dict[str, Any] | None:
        """The next message, None at end of file, _Deadline when the deadline passes."""
        while True:
            nl = self._buf.find(b"\n")
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                try:
                    return json.loads(line)
                except ValueError:
                    return None  # a garbled protocol line: treat the host as dead
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Deadline()
            if not self._rpoll.poll(remaining * 1000):
                raise _Deadline()
            try:
                chunk = os.read(self._rfd, 1 << 20)
            except OSError:
                return None
            if not chunk:
                return None
            self._buf += chunk

    # -------------------------------------------------------------- batches

    def _batch(self, kind: str, items: list[Any], fn: str | None = None) -> list[CallResult]:
        if not items:
            return []
        with self._lock:
            if self._closed:
                raise RuntimeError("the harness host is closed")
            results: list[CallResult | None] = [None] * len(items)
            pending = list(range(len(items)))
            lost = 0.0
            send_failures = 0
            while pending:
                if lost >= self.timeout_budget_s:
                    for i in pending:
                        results[i] = CallResult(
                            False,
                            None,
                            f"not run: this batch already lost {lost:.1f}s to harness timeouts",
                            "timeout",
                        )
                    break
                if not self.alive:
                    try:
                        self._restart()
                    except (HarnessLoadError, OSError) as exc:
                        for i in pending:
                            results[i] = CallResult(
                                False, None, f"host restart failed: {exc}", "crashed"
                            )
                        break
                request = {
                    "op": "batch",
                    "kind": kind,
                    "fn": fn,
                    "items": [items[i] for i in pending],
                    "budget_s": self.timeout_budget_s - lost,
                }
                try:
                    data = _encode(request)
                except (TypeError, ValueError) as exc:
                    raise TypeError(f"{kind} requests must be plain JSON data: {exc}") from None
                try:
                    self._send(data, time.monotonic() + 30.0 + len(data) / 1e6)
                except (_HostGone, _Deadline):
                    self._kill()
                    send_failures += 1
                    if send_failures > 2:
                        for i in pending:
                            results[i] = CallResult(
                                False, None, "could not reach the harness host", "crashed"
                            )
                        break
                    continue
                pending, spent = self._collect(pending, results, len(data))
                lost += spent
            for r in results:
                if r is not None and not r.ok:
                    self.failures[r.kind] += 1
            return [
                r if r is not None else CallResult(False, None, "no result", "crashed")
                for r in results
            ]

    def _collect(
        self, pending: list[int], results: list[CallResult | None], size: int
    ) -> tuple[list[int], float]:
        """Read one batch's results; on a hang or a death, blame the call in progress."""
        j = 0
        lost = 0.0
        last = time.monotonic()
        first_extra = 1.0 + size / 20e6  # the host first reads and decodes the request
        while True:
            deadline = last + self._call_deadline_s + (first_extra if j == 0 else 0.0)
            try:
                msg = self._read_message(deadline)
            except _Deadline:
                lost += time.monotonic() - last
                results[pending[j]] = CallResult(
                    False,
                    None,
                    f"call did not finish within {self.sandbox.call_timeout_s:g}s "
                    "(the harness host was stopped and restarted)",
                    "timeout",
                )
                self._kill()
                return pending[j + 1 :], lost
            if msg is None:
                kind, reason = self._death_reason()
                results[pending[j]] = CallResult(False, None, reason, kind)
                self._kill()
                return pending[j + 1 :], lost
            last = time.monotonic()
            if msg.get("type") == "end":
                cpu = float(msg.get("cpu", 0.0))
                if cpu > 0.8 * self.sandbox.cpu_seconds:
                    self._kill()  # recycle before the CPU limit kills it mid-call
                return [], lost
            if msg.get("type") != "result":
                continue
            j = int(msg["i"])
            kind = msg.get("kind", "ok")
            if kind == "timeout":
                lost += float(msg.get("seconds", 0.0))
            results[pending[j]] = CallResult(
                ok=bool(msg.get("ok")),
                value=msg.get("value"),
                error=str(msg.get("error", "")),
                kind=kind,
                output=str(msg.get("output", "")),
                line=int(msg.get("line", 0) or 0),
            )
            j += 1

    def render(self, requests: Sequence[Any]) -> list[CallResult]:
        """Chat messages for each (fields, history, context): one round trip for the batch.

        Each request is a `RenderRequest` or a mapping with "fields", "history" and "context";
        nothing else is sent to the host. A successful value is a list of {"role", "content"}.
        """
        items = []
        for n, req in enumerate(requests):
            fields, history, context = _get(req, n, "fields", "history", "context")
            if not isinstance(fields, Mapping):
                raise TypeError(f"render request {n}: fields must be a mapping")
            if not isinstance(history, Sequence) or isinstance(history, str):
                raise TypeError(f"render request {n}: history must be a list of entries")
            items.append(
                {
                    "fields": dict(fields),
                    "history": [dict(e) for e in history],
                    "context": dict(context or {}),
                }
            )
        return self._batch("render", items)

    def parse(self, requests: Sequence[Any]) -> list[CallResult]:
        """The raw action (str | dict | None) for each reply: one round trip for the batch.

        Each request is a `ParseRequest`, a mapping with "response" and "context", or a plain str.
        """
        items = []
        for n, req in enumerate(requests):
            if isinstance(req, str):
                response, context = req, {}
            else:
                response, context = _get(req, n, "response", "context")
            if not isinstance(response, str):
                raise TypeError(f"parse request {n}: response must be str")
            items.append({"response": response, "context": dict(context or {})})
        return self._batch("parse", items)

    def call(self, fn: str, kwargs_list: Sequence[Any]) -> list[CallResult]:
        """Call a module function once per item (a kwargs mapping or a list of positional args).

        Used by validation; values must be JSON data. A function the module does not define gives
        kind "missing" (function surfaces fall back to their defaults).
        """
        items: list[Any] = []
        for n, item in enumerate(kwargs_list):
            if isinstance(item, Mapping):
                items.append(dict(item))
            elif isinstance(item, (list, tuple)):
                items.append(list(item))
            else:
                raise TypeError(f"call item {n}: expected a kwargs mapping or a list of arguments")
        return self._batch("call", items, fn)

    # -------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Stop the host process and remove its working folder; safe to call twice."""
        with self._lock:
            self._closed = True
            if self._proc is not None and self._proc.poll() is None and self._wfd >= 0:
                with contextlib.suppress(Exception):
                    os.write(self._wfd, b'{"op": "exit"}\n')
                with contextlib.suppress(Exception):
                    self._proc.wait(timeout=0.5)
            self._kill()
            if self._tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
                self._tmp = ""

    def __enter__(self) -> HarnessHost:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser (e.g. at interpreter exit)
            pass

    def __repr__(self) -> str:
        return f"HarnessHost({str(self.path)!r}, pid={self.pid}, restarts={self.restarts})"


def _encode(request: dict[str, Any]) -> bytes:
    """Compact UTF-8 JSON; lone surrogates (only ever inside strings) travel as JSON escapes."""
    text = json.dumps(request, ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", "backslashreplace")


def _get(req: Any, n: int, *names: str) -> tuple[Any, ...]:
    if isinstance(req, Mapping):
        missing = [k for k in names if k not in req and k != "context"]
        if missing:
            raise TypeError(f"request {n} is missing {', '.join(missing)}")
        return tuple(req.get(k) for k in names)
    try:
        return tuple(getattr(req, k) for k in names)
    except AttributeError:
        raise TypeError(f"request {n}: expected a mapping or a request object") from None
