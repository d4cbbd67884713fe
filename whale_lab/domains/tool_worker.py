"""Warm workers for the math `python` tool: one confined interpreter per episode, fed over a pipe.

Starting a sandboxed interpreter per call (`interpreter.run_python`) costs tens of milliseconds of
wall and CPU time, most of a math tool call. Here an episode's first call takes a worker that
was started ahead of time, inside the same sandbox with the same limits (`confine.wrap`: no
network, own PID namespace, read-only view, clean environment, seccomp; RLIMIT_AS, RLIMIT_CPU per
call, RLIMIT_FSIZE on the capture files), and later calls of that episode reuse it. Each snippet
runs in a new globals dict with the builtins and standard streams reset
(`tool_worker_main.py`), and every call reports through `interpreter.outcome`, so results and
messages are those of the cold path.

A worker serves one episode only: when the episode ends (`ToolSession.end`, called from the
environment's `final_info`) its process is stopped, so imported or patched modules never reach
another episode. It is also replaced after a timeout, a limit it hit (memory, output), a crash,
an unreadable reply, and after CALLS_PER_WORKER calls (its CPU-time budget). `ToolWorkers.close`
stops every process; a process also ends when the engine does: bwrap's `--die-with-parent` (the
processes are started from one long-lived thread, since the kernel ties that signal to the
starting thread, not the process), and the worker itself leaves when its request pipe closes.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import marshal
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from whale_lab import confine
from whale_lab.domains.interpreter import (
    InterpreterLimits,
    PythonResult,
    decode_capped,
    outcome,
    process_limits,
    unconfined_env,
)

CALLS_PER_WORKER = 64  # then the worker is replaced (its CPU budget is this many calls' worth)
MAX_WORKERS = 32  # idle processes kept (episodes' workers plus spares; ~15 MB each); no more
SPARES = 2  # workers started ahead of the next episode's first call
START_TIMEOUT_S = 20.0  # for a worker to report ready (a loaded machine starts slowly)
MAX_REPLY_BYTES = 256  # a reply is one short line
WORKER_ENTRY = Path(__file__).with_name("tool_worker_main.py")

T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def _worker_source() -> str:
    """The worker's program: the sandbox binds no file of the project."""
    return WORKER_ENTRY.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def _worker_code() -> bytes:
    """The worker's program compiled once here and marshalled: a worker starts per episode,
    and compiling the program there cost each start about 3 ms of CPU. The worker runs the
    interpreter this one is (`confine.python_executable`), so the bytecode is its own."""
    return marshal.dumps(compile(_worker_source(), "<string>", "exec", dont_inherit=True))


# Run with -c: reads the marshalled program from the descriptor in its last argument (a pipe
# holding it whole), then runs it as the main module, with the arguments the program expects.
_LOADER = (
    "import marshal, os, sys\n"
    "_fd = int(sys.argv.pop())\n"
    "_parts = []\n"
    "while True:\n"
    "    _b = os.read(_fd, 65536)\n"
    "    if not _b:\n"
    "        break\n"
    "    _parts.append(_b)\n"
    "os.close(_fd)\n"
    "_code = marshal.loads(b''.join(_parts))\n"
    "del _fd, _parts, _b\n"
    "exec(_code)\n"
)


_F_SETPIPE_SZ = 1031  # Linux's fcntl for a pipe's capacity


def _code_pipe() -> int:
    """A pipe's read end holding the marshalled program, written whole before the worker starts
    (the pipe is grown to fit it where the default 64 KiB would not)."""
    code = _worker_code()
    r, w = os.pipe()
    try:
        if len(code) > 65536:
            import fcntl

            fcntl.fcntl(w, _F_SETPIPE_SZ, len(code))
        os.set_blocking(w, False)  # never hang here: a program that does not fit is an error
        view = memoryview(code)
        while view:
            view = view[os.write(w, view) :]
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return r


class _Spawner:
    """Starts processes from one thread that lives as long as the engine.

    bwrap's --die-with-parent is PR_SET_PDEATHSIG, which fires when the *thread* that started it
    ends; a worker started from a short-lived thread would die with that thread.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():  # none yet, or after a fork
                self._jobs = queue.SimpleQueue()
                self._thread = threading.Thread(
                    target=self._loop, args=(self._jobs,), name="whale-tool-spawner", daemon=True
                )
                self._thread.start()
            self._jobs.put((future, fn))
        return future

    @staticmethod
    def _loop(jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]]) -> None:
        while True:
            future, fn = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)
            del future, fn  # hold nothing (a pool, through a callback) until the next job


_SPAWNER = _Spawner()


class ToolWorker:
    """One warm interpreter process for one episode; `run` is called by one thread at a time."""

    def __init__(self, limits: InterpreterLimits, conf: confine.Confinement) -> None:
        self.limits = limits
        self.confined = conf.confined
        self.calls = 0
        self.cpu_used = 0.0
        lim = process_limits(limits)
        self._cpu_s = lim.cpu_s
        self._cpu_budget = lim.cpu_s * CALLS_PER_WORKER + 1
        self._ready = False
        self._ids = itertools.count(1)
        self._state = threading.RLock()  # re-entrant: a finaliser may stop a worker mid-update
        self._busy = False
        self._stopping = False
        self._released = False
        self._tmp = tempfile.mkdtemp(prefix="whale-pyw-")
        opened: list[int] = []
        try:
            flags = os.O_CLOEXEC
            out_w = os.open(os.path.join(self._tmp, "stdout"), os.O_WRONLY | os.O_CREAT | flags, 0o600)
            opened.append(out_w)
            err_w = os.open(os.path.join(self._tmp, "stderr"), os.O_WRONLY | os.O_CREAT | flags, 0o600)
            opened.append(err_w)
            self._out = os.open(os.path.join(self._tmp, "stdout"), os.O_RDONLY | flags)
            self._err = os.open(os.path.join(self._tmp, "stderr"), os.O_RDONLY | flags)
            req_r, self._req = os.pipe()
            opened.append(req_r)
            self._reply, rep_w = os.pipe()
            opened.append(rep_w)
            os.set_blocking(self._req, False)
            code_r = _code_pipe()
            opened.append(code_r)
            args = [str(lim.memory_bytes), str(lim.cpu_s), str(self._cpu_budget),
                    str(lim.file_bytes), str(rep_w), str(code_r)]
            # -I: no environment, no user site, no script folder; -S: no site-packages (no
            # whale_lab); -B: no bytecode written anywhere.
            wrapped: confine.Wrapped | None = None
            if conf.confined:
                env = confine.clean_env(lim.env)
                cmd = [confine.python_executable(), "-I", "-S", "-B", "-c", _LOADER]
                wrapped = confine.wrap([*cmd, *args], bwrap=conf.bwrap, env=env)
                cmd, fds = wrapped.argv, (rep_w, code_r, *wrapped.pass_fds)
            else:
                env = unconfined_env(self._tmp, lim.env)
                cmd = [sys.executable, "-I", "-S", "-B", "-c", _LOADER, *args]
                fds = (rep_w, code_r)
            try:
                self.proc = subprocess.Popen(
                    cmd,
                    cwd=self._tmp,
                    env=env,
                    stdin=req_r,
                    stdout=out_w,
                    stderr=err_w,
                    pass_fds=fds,
                    start_new_session=True,
                )
            finally:
                if wrapped is not None:
                    wrapped.close()
        except BaseException:
            for fd in (getattr(self, name, None) for name in ("_out", "_err", "_req", "_reply")):
                if fd is not None:
                    os.close(fd)
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        finally:
            for fd in opened:
                os.close(fd)

    @classmethod
    def start(cls, limits: InterpreterLimits, conf: confine.Confinement) -> Future[ToolWorker]:
        """A worker being started on the spawner thread (it reports ready on its own time)."""
        return _SPAWNER.submit(lambda: cls(limits, conf))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def usable(self, limits: InterpreterLimits, confined: bool) -> bool:
        """Whether this worker may take a call with these limits under this confinement."""
        return (
            not self._stopping
            and self.proc.poll() is None
            and self.limits == limits
            and self.confined == confined
        )

    # ---------------------------------------------------------------- one call

    def run(self, code: str) -> tuple[PythonResult | None, bool]:
        """(result, whether the worker may take another call). The result is None when the
        worker could not run the code at all (an earlier snippet broke it): run it elsewhere."""
        with self._state:
            if self._stopping:
                return None, False
            self._busy = True
        try:
            return self._run(code)
        finally:
            with self._state:
                self._busy = False
                release = self._stopping
            if release:
                self._release()

    def _run(self, code: str) -> tuple[PythonResult | None, bool]:
        limits = self.limits
        if not self._ready:
            kind, text = self._receive(time.monotonic() + START_TIMEOUT_S)
            if kind == "timeout":
                self._terminate()
                error = f"TimeoutError: the tool process did not start within {START_TIMEOUT_S:g} s"
                return PythonResult(stdout="", error=error, timed_out=True), False
            if kind == "eof":
                return self._ended(), False
            if text != "ready":
                return self._unreadable(), False
            self._ready = True
        call_id = next(self._ids)
        body = call_id.to_bytes(8, "big") + code.encode("utf-8", "surrogatepass")
        deadline = time.monotonic() + limits.timeout_s
        self.calls += 1
        sent = self._send(len(body).to_bytes(4, "big") + body, deadline)
        kind, text = self._receive(deadline) if sent == "sent" else (sent, "")
        if kind == "timeout":
            self._terminate()
            self.proc.wait()
            return self._result(self.proc.returncode, timed_out=True), False
        if kind == "eof":
            return self._ended(), False
        parsed = _parse_reply(text, call_id) if kind == "reply" else None
        if parsed is None:
            return self._unreadable(), False
        rc, breach, cpu_used = parsed
        if breach == "unfit":
            return None, False
        self.cpu_used = cpu_used
        result = self._result(rc)
        healthy = (
            not breach
            and not result.truncated
            and not result.error.startswith("OutputLimit")
            and self.calls < CALLS_PER_WORKER
            and self.cpu_used + self._cpu_s + 1 < self._cpu_budget
        )
        return result, healthy

    def _result(self, rc: int, *, timed_out: bool = False) -> PythonResult:
        max_chars = self.limits.max_output_chars
        stdout, truncated = decode_capped(os.pread(self._out, max_chars * 4 + 4, 0), max_chars)
        stderr, _ = decode_capped(os.pread(self._err, max_chars * 4 + 4, 0), max_chars)
        return outcome(stdout, truncated, stderr, rc, timed_out, self.confined, self.limits)

    def _ended(self) -> PythonResult:
        """The process ended (or dropped its reply pipe) during the call: report how it ended."""
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self._terminate()
            self.proc.wait()
        return self._result(self.proc.returncode)

    def _unreadable(self) -> PythonResult:
        self._terminate()
        self.proc.wait()
        result = self._result(0)
        return PythonResult(
            stdout=result.stdout,
            error="ProtocolError: the code interfered with the tool process, which was restarted",
            truncated=result.truncated,
        )

    # ---------------------------------------------------------------- the pipes

    def _send(self, data: bytes, deadline: float) -> str:
        """How sending a request went: "sent", "timeout" or "eof" (the worker is gone)."""
        view = memoryview(data)
        while view:
            if not _wait(self._req, select.POLLOUT, deadline):
                return "timeout"
            try:
                n = os.write(self._req, view)
            except BlockingIOError:
                continue
            except OSError:  # EPIPE: the worker has ended
                return "eof"
            view = view[n:]
        return "sent"

    def _receive(self, deadline: float) -> tuple[str, str]:
        """("reply", its text), or ("timeout" | "eof" | "garbled", "")."""
        head = self._read(4, deadline)
        if isinstance(head, str):
            return head, ""
        size = int.from_bytes(head, "big")
        if size > MAX_REPLY_BYTES:
            return "garbled", ""
        body = self._read(size, deadline)
        if isinstance(body, str):
            return ("garbled" if body == "eof" else body), ""
        try:
            return "reply", body.decode("ascii")
        except UnicodeDecodeError:
            return "garbled", ""

    def _read(self, n: int, deadline: float) -> bytes | str:
        """`n` bytes of the reply pipe, or "timeout" or "eof"."""
        buf = b""
        while len(buf) < n:
            if not _wait(self._reply, select.POLLIN, deadline):
                return "timeout"
            chunk = os.read(self._reply, n - len(buf))
            if not chunk:
                return "eof"
            buf += chunk
        return buf

    # ---------------------------------------------------------------- stopping

    def _terminate(self) -> None:
        """Kill the process group (bwrap's sandbox goes with it); safe from any thread."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self) -> None:
        """Kill the process; its pipes and files are released now, or by a call in progress."""
        with self._state:
            self._stopping = True
            busy = self._busy
        self._terminate()
        if not busy:
            self._release()

    def _release(self) -> None:
        with self._state:
            if self._released:
                return
            self._released = True
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # cannot happen after SIGKILL; never hang a close
            pass
        for fd in (self._out, self._err, self._req, self._reply):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._tmp, ignore_errors=True)


def _wait(fd: int, event: int, deadline: float) -> bool:
    """Whether `fd` is ready (or has hung up) before the deadline; poll has no descriptor limit,
    unlike select, and an engine may hold many descriptors."""
    poller = select.poll()
    poller.register(fd, event)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if poller.poll(max(1, int(left * 1000 + 0.999))):
            return True


def _parse_reply(reply: str, call_id: int) -> tuple[int, str, float] | None:
    """(exit status, breach, CPU seconds used) from `ID RC BREACH CPU`, or None if it is not the
    reply to this call."""
    parts = reply.split(" ")
    if len(parts) != 4 or parts[2] not in ("-", "memory", "output", "unfit"):
        return None
    try:
        rid, rc, cpu = int(parts[0]), int(parts[1]), float(parts[3])
    except ValueError:
        return None
    if rid != call_id:
        return None
    return rc, "" if parts[2] == "-" else parts[2], cpu


class ToolSession:
    """One episode's use of the pool: its calls share a worker, which stops when it ends."""

    def __init__(self, pool: ToolWorkers, token: int, limits: InterpreterLimits) -> None:
        self.token = token
        self.limits = limits
        self._pool = pool
        self._end = weakref.finalize(self, pool.end, token)  # an episode dropped unfinished

    def run(self, code: str) -> PythonResult:
        return self._pool.run(self.token, code, self.limits)

    def end(self) -> None:
        """The episode is over: stop its worker, so nothing it left reaches another episode."""
        self._end()


class ToolWorkers:
    """A math domain's workers: one per episode with a call in flight or to come, plus spares.

    Thread-safe: the rollout steps environments from several threads at once.
    """

    def __init__(
        self,
        limits: InterpreterLimits,
        *,
        max_workers: int = MAX_WORKERS,
        spares: int = SPARES,
    ) -> None:
        self.limits = limits  # for the spares
        self.max_workers = max(1, max_workers)
        self.spares = max(0, min(spares, self.max_workers - 1))
        # Re-entrant: a finaliser (an episode or domain dropped) may end a session from inside a
        # section of this same thread that holds the lock, when garbage collection runs there.
        self._lock = threading.RLock()
        self._tokens = itertools.count(1)
        self._live: set[int] = set()
        self._owned: dict[int, ToolWorker] = {}  # idle, each kept for its episode's next call
        self._spare: list[ToolWorker] = []
        self._all: set[ToolWorker] = set()  # every process of this pool, busy ones included
        self._pending: set[Future[ToolWorker]] = set()
        self._closed = False
        _POOLS.add(self)
        weakref.finalize(self, _stop_all, self._all)  # a pool dropped without close()

    def session(self, limits: InterpreterLimits | None = None) -> ToolSession:
        with self._lock:
            token = next(self._tokens)
            self._live.add(token)
        return ToolSession(self, token, limits or self.limits)

    def run(self, token: int, code: str, limits: InterpreterLimits | None = None) -> PythonResult:
        """Run `code` for the episode `token` on its worker; never raises for what the code does.

        Raises ConfinementError only when confinement is required and this machine cannot confine.
        """
        limits = limits or self.limits
        conf = confine.enforce(limits.allow_unconfined, "tool code")
        for _ in range(2):  # a second time on a fresh worker if the first could not run it
            worker = self._take(token, limits, conf)
            try:
                result, healthy = worker.run(code)
            except BaseException:
                self._drop(worker)
                raise
            self._put_back(token, worker, healthy)
            if result is not None:
                return result
        return PythonResult(stdout="", error="the tool process could not run the code")

    def end(self, token: int) -> None:
        """The episode `token` is over: its worker stops."""
        with self._lock:
            self._live.discard(token)
            worker = self._owned.pop(token, None)
            if worker is not None:
                self._all.discard(worker)
        if worker is not None:
            worker.stop()

    def close(self) -> None:
        """Stop every process of this pool now. A later call still works, on a worker of its own
        that stops when the call ends."""
        with self._lock:
            self._closed = True
            pending = list(self._pending)
        for future in pending:  # a spare being started: wait for it, then stop it
            try:
                future.result(timeout=START_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - it did not start: nothing to stop
                pass
        with self._lock:
            workers = list(self._all)
            self._all.clear()
            self._owned.clear()
            self._spare.clear()
        for worker in workers:
            worker.stop()

    def pids(self) -> list[int]:
        """The processes this pool holds now (bwrap's, where confined)."""
        with self._lock:
            return sorted(w.pid for w in self._all)

    # ---------------------------------------------------------------- bookkeeping

    def _take(self, token: int, limits: InterpreterLimits, conf: confine.Confinement) -> ToolWorker:
        stale: list[ToolWorker] = []
        worker: ToolWorker | None = None
        with self._lock:
            owned = self._owned.pop(token, None)
            if owned is not None:
                if owned.usable(limits, conf.confined):
                    worker = owned
                else:
                    stale.append(owned)
            while worker is None and self._spare:
                spare = self._spare.pop(0)
                if spare.usable(limits, conf.confined):
                    worker = spare
                else:
                    stale.append(spare)
            self.limits = limits
            for w in stale:
                self._all.discard(w)
        for w in stale:
            w.stop()
        if worker is not None:
            self._refill(limits, conf)
            return worker
        own = ToolWorker.start(limits, conf)  # queued before the spares
        self._refill(limits, conf)
        worker = own.result()
        with self._lock:
            self._all.add(worker)
        return worker

    def _refill(self, limits: InterpreterLimits, conf: confine.Confinement) -> None:
        """Start spares (without waiting for them) until there are `spares` ready or starting."""
        while True:
            with self._lock:
                if self._closed or len(self._spare) + len(self._pending) >= self.spares:
                    return
                future = ToolWorker.start(limits, conf)
                self._pending.add(future)
            future.add_done_callback(self._spare_started)

    def _spare_started(self, future: Future[ToolWorker]) -> None:
        if future.exception() is not None:
            with self._lock:
                self._pending.discard(future)
            return
        worker = future.result()
        with self._lock:
            self._pending.discard(future)
            keep = not self._closed
            if keep:
                self._spare.append(worker)
                self._all.add(worker)
        if not keep:
            worker.stop()

    def _put_back(self, token: int, worker: ToolWorker, healthy: bool) -> None:
        with self._lock:
            keep = (
                healthy
                and not self._closed
                and token in self._live
                and len(self._owned) < self.max_workers - self.spares
            )
            if keep:
                self._owned[token] = worker
            else:
                self._all.discard(worker)
        if not keep:
            worker.stop()

    def _drop(self, worker: ToolWorker) -> None:
        with self._lock:
            self._all.discard(worker)
        worker.stop()


def _stop_all(workers: set[ToolWorker]) -> None:
    for worker in list(workers):
        worker.stop()
    workers.clear()


_POOLS: weakref.WeakSet[ToolWorkers] = weakref.WeakSet()


def _forget_in_child() -> None:
    """A forked child holds copies of its parent's pools: it must never stop their workers."""
    for pool in list(_POOLS):
        pool._lock = threading.RLock()
        pool._owned, pool._spare, pool._all, pool._pending = {}, [], set(), set()


os.register_at_fork(after_in_child=_forget_in_child)


@atexit.register
def _close_all() -> None:
    """At a normal exit (an engine that ends by os._exit relies on --die-with-parent and the
    workers' own end-of-file check)."""
    for pool in list(_POOLS):
        pool.close()
