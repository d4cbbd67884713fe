"""The math tool's warm worker: one long-lived interpreter that runs snippets on request.

It runs inside the sandbox (or, where confinement is off and allowed, under resource limits only)
as `python -I -S -B -c <loader> MEM CPU CPU_BUDGET FSIZE REPLY_FD CODE_FD`: the engine compiles
this file once and the loader reads the marshalled code from CODE_FD and runs it as `__main__`
(`tool_worker._LOADER`), so it may use the standard library only. Its stdin is the request pipe (moved off fd 0 at start, so that `input()`
reads /dev/null as before), fds 1 and 2 are the engine's capture files (emptied before each
snippet, so RLIMIT_FSIZE caps each call's output), and REPLY_FD carries the replies.

Each message is a 4-byte big-endian length and a body. A request body is an 8-byte call id and
the code in UTF-8. A reply body is ASCII: first `ready`, then per request `ID RC BREACH CPU`,
where RC is the exit status a fresh interpreter would have ended with, BREACH is `-`, `memory`
or `output` (a limit the snippet hit: the engine replaces this worker) or `unfit` (an earlier
snippet left the interpreter unable to run another, so this one did not run), and CPU is the CPU
time used so far. The protocol uses no module a snippet could patch (no json), and the worker
keeps its own references to what it calls, so a snippet that changes `os` or `io` for itself
does not break the worker.

A snippet runs as `__main__` in a new globals dict, with the builtins restored to what they were
at start and fresh standard streams; what it imports or changes elsewhere in the interpreter
stays until the engine replaces the worker, which it does between episodes. When the engine goes
away the request pipe reads end-of-file and the worker ends at once, even in mid-snippet.

A worker starts per episode, so its start-up is paid per episode: it imports only modules built
into the interpreter or already loaded at start (`_thread` and `_queue`, not `threading` and
`queue`), and `traceback` and `linecache` (with `re`, `tokenize` and the rest they pull in:
two thirds of a bare start's CPU again) only when they are needed: when a snippet's exception
is printed, or when the snippet imports them itself (`_SnippetSource` then gives linecache the
snippet's source, as the cold path's has).
"""

from __future__ import annotations

import _queue
import _thread
import atexit
import builtins
import errno
import gc
import io
import os
import resource
import sys

NAME = "<python>"

# The worker's own references: a snippet may rebind these modules' attributes for itself.
_read, _write, _exit = os.read, os.write, os._exit
_ftruncate, _lseek, _open, _dup, _dup2, _close = (
    os.ftruncate, os.lseek, os.open, os.dup, os.dup2, os.close
)
_getrusage, _setrlimit = resource.getrusage, resource.setrlimit
_FileIO, _BufferedWriter, _BufferedReader, _TextIOWrapper = (
    io.FileIO, io.BufferedWriter, io.BufferedReader, io.TextIOWrapper
)
_run_exitfuncs, _collect = atexit._run_exitfuncs, gc.collect
_start_thread, _SimpleQueue = _thread.start_new_thread, _queue.SimpleQueue
_modules = sys.modules
_BUILTINS = builtins.__dict__


class _SnippetSource:
    """Puts the running snippet's source into linecache however linecache comes to be loaded.

    A meta-path entry that only watches for `linecache`: the import itself is left to the
    finders after it, and once the module has run, the source is added to its cache (so that
    `traceback.print_exc()` in a snippet shows the snippet's lines, as on the cold path).
    """

    source = ""

    @classmethod
    def find_spec(cls, name: str, path: object = None, target: object = None) -> object:
        if name != "linecache":
            return None
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _SeedingLoader(spec.loader)
                return spec
        return None

    @classmethod
    def seed(cls, module: object) -> None:
        src = cls.source
        cache = getattr(module, "cache", None)
        if src and isinstance(cache, dict):
            cache[NAME] = (len(src), None, src.splitlines(True), NAME)


class _SeedingLoader:
    def __init__(self, loader: object) -> None:
        self.loader = loader

    def create_module(self, spec: object) -> object:
        return self.loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        self.loader.exec_module(module)  # type: ignore[attr-defined]
        _SnippetSource.seed(module)


def _show_source(src: str) -> None:
    """This snippet's source for linecache: now if it is loaded, else when it is."""
    _SnippetSource.source = src
    linecache = _modules.get("linecache")
    if linecache is not None:
        _SnippetSource.seed(linecache)


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = _read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _send(fd: int, text: str) -> None:
    body = text.encode("ascii")
    data = len(body).to_bytes(4, "big") + body
    while data:
        data = data[_write(fd, data) :]


def _reader(fd: int, inbox: _queue.SimpleQueue[bytes]) -> None:
    """Requests into the inbox; end-of-file means the engine is gone, so end the process."""
    while True:
        head = _read_exact(fd, 4)
        body = _read_exact(fd, int.from_bytes(head, "big")) if head is not None else None
        if body is None:
            _exit(0)
        inbox.put(body)


def _cpu_used() -> float:
    usage = _getrusage(resource.RUSAGE_SELF)
    return usage[0] + usage[1]


class _Streams:
    """Fresh sys.stdin/stdout/stderr per snippet, built like the ones the interpreter started with
    (a snippet may have closed, replaced or half-filled them)."""

    def __init__(self) -> None:
        self.spec = {
            fd: (stream.encoding, stream.errors, stream.line_buffering, stream.write_through)
            for fd, stream in ((1, sys.stdout), (2, sys.stderr))
        }
        self.stdin_spec = (sys.stdin.encoding, sys.stdin.errors)

    def install(self) -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
        out = []
        for fd in (1, 2):
            encoding, errors, line_buffering, write_through = self.spec[fd]
            out.append(
                _TextIOWrapper(
                    _BufferedWriter(_FileIO(fd, "w", closefd=False)),
                    encoding=encoding,
                    errors=errors,
                    line_buffering=line_buffering,
                    write_through=write_through,
                )
            )
        encoding, errors = self.stdin_spec
        stdin = _TextIOWrapper(
            _BufferedReader(_FileIO(0, "r", closefd=False)), encoding=encoding, errors=errors
        )
        sys.stdin, sys.stdout, sys.stderr = stdin, out[0], out[1]
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = stdin, out[0], out[1]
        return out[0], out[1]


def _restore_builtins(saved: dict[str, object]) -> None:
    _BUILTINS.clear()
    _BUILTINS.update(saved)


def _exit_status(exc: SystemExit) -> int:
    """The status `raise SystemExit(code)` gives a fresh interpreter (a message goes to stderr)."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        print(code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the status matters more than the message
        pass
    return 1


def _breach(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "memory"
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        return "output"
    return ""


def _join_threads() -> None:
    """Wait for the snippet's non-daemon threads, as interpreter shutdown would.

    Only `threading` makes such threads, so without it loaded there is nothing to wait for
    (the worker's own reader is a bare `_thread` one, which `threading` lists as a daemon if
    it lists it at all)."""
    threading = _modules.get("threading")
    if threading is None:
        return
    try:
        main = threading.main_thread()
        for thread in threading.enumerate():
            if thread is not main and not thread.daemon and thread.is_alive():
                thread.join()
    except BaseException:  # noqa: BLE001 - a snippet that broke threading: nothing to wait for
        pass


def _print_exception(exc: BaseException, tb: object) -> None:
    """As the interpreter prints an uncaught exception (traceback loaded now, if not yet)."""
    import traceback

    traceback.print_exception(type(exc), exc, tb)


def _flush_at_exit(out: io.TextIOWrapper, err: io.TextIOWrapper) -> tuple[int, str]:
    """Flush as interpreter shutdown does: (120 if sys.stdout or sys.stderr could not be
    flushed, else 0; the limit a failed flush hit)."""
    status, breach = 0, ""
    for stream, report in ((sys.stdout, True), (sys.stderr, False)):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except BaseException as exc:  # noqa: BLE001 - shutdown reports, never raises
            status, breach = 120, breach or _breach(exc)
            if report:
                try:
                    _write(2, f"Exception ignored in: {stream!r}\n{exc!r}\n".encode())
                except BaseException:  # noqa: BLE001
                    pass
    for stream in (out, err):  # the originals, if the snippet replaced them
        try:
            if not stream.closed:
                stream.flush()
        except BaseException as exc:  # noqa: BLE001
            breach = breach or _breach(exc)
    return status, breach


def _prepare(src: str, streams: _Streams, saved: dict[str, object], cpu: int,
             budget: int) -> tuple[io.TextIOWrapper, io.TextIOWrapper]:
    """Builtins as at start, empty capture files, fresh streams, this call's CPU allowance."""
    _restore_builtins(saved)
    for fd in (1, 2):
        _ftruncate(fd, 0)
        _lseek(fd, 0, os.SEEK_SET)
    out, err = streams.install()
    _setrlimit(resource.RLIMIT_CPU, (min(budget, int(_cpu_used()) + 1 + cpu), budget))
    _show_source(src)
    sys.argv = [NAME]
    return out, err


def run_snippet(src: str, out: io.TextIOWrapper, err: io.TextIOWrapper,
                saved: dict[str, object]) -> tuple[int, str]:
    """Run one snippet as a fresh interpreter would; (exit status, limit breached or "")."""
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    raised: BaseException | None = None
    try:
        exec(compile(src, NAME, "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 - reported below as the interpreter would
        raised = exc
    _restore_builtins(saved)  # what follows is the worker's, whatever the snippet patched
    rc, breach = 0, ""
    if isinstance(raised, SystemExit):
        rc = _exit_status(raised)
    elif raised is not None:
        breach = _breach(raised)
        tb = raised.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != NAME:
            tb = tb.tb_next
        try:
            sys.stdout.flush()
        except BaseException:  # noqa: BLE001
            pass
        try:
            _print_exception(raised, tb)
        except BaseException:  # noqa: BLE001
            pass
        rc = 1
    raised = None
    # What interpreter shutdown would do next: wait for threads, run atexit, flush the streams.
    _join_threads()
    try:
        _run_exitfuncs()
    except BaseException:  # noqa: BLE001 - atexit reports its own errors
        pass
    status, flush_breach = _flush_at_exit(out, err)
    namespace.clear()
    return (status or rc), (flush_breach or breach)  # as Py_FinalizeEx: 120 wins


def main() -> None:
    mem, cpu, budget, fsize, reply = (int(a) for a in sys.argv[1:6])
    if mem > 0:
        _setrlimit(resource.RLIMIT_AS, (mem, mem))
    _setrlimit(resource.RLIMIT_CPU, (cpu, budget))
    _setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    _setrlimit(resource.RLIMIT_CORE, (0, 0))
    requests = _dup(0)
    null = _open(os.devnull, os.O_RDONLY)
    _dup2(null, 0)
    _close(null)
    inbox: _queue.SimpleQueue[bytes] = _SimpleQueue()
    _start_thread(_reader, (requests, inbox))
    sys.meta_path.insert(0, _SnippetSource)  # type: ignore[arg-type]
    streams = _Streams()
    saved = dict(_BUILTINS)
    _send(reply, "ready")
    while True:
        body = inbox.get()
        call_id = int.from_bytes(body[:8], "big")
        src = body[8:].decode("utf-8", "surrogatepass")
        try:
            out, err = _prepare(src, streams, saved, cpu, budget)
        except BaseException:  # noqa: BLE001 - an earlier snippet broke the interpreter
            rc, breach = -1, "unfit"
        else:
            rc, breach = run_snippet(src, out, err, saved)
            del out, err
            _restore_builtins(saved)
            _collect()
        _send(reply, f"{call_id} {rc} {breach or '-'} {_cpu_used():.3f}")


if __name__ == "__main__":
    main()
