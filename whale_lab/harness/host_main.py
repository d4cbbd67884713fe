"""The harness host process: `python -m whale_lab.harness.host_main --in FD --out FD ...`.

It talks to its client (host.py) over two dedicated pipes, one JSON message per line, so nothing the
harness prints can corrupt the protocol: harness code writes to a capped `sys.stdout`/`sys.stderr`
whose text is returned with each call (truncated past the cap; a flood aborts the call). Resource
limits are set first thing, before any harness code exists in the process. Every call runs under an
interval timer so Python-level loops end as "timeout"; hangs inside C code that never return to the
interpreter are caught by the client's own deadline, which kills and restarts this process.

Requests: {"op": "load", ...} once, then {"op": "batch", "kind": "render"|"parse"|"call", ...}.
Each batch item is answered by one {"type": "result", "i": ...} line as soon as it is done, then
{"type": "end", "cpu": seconds}.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from whale_lab.harness.runtime import (
    HarnessRuntime,
    HarnessTimeout,
    HarnessTypeError,
    LoadFailure,
    MissingFunction,
    OutputFlood,
    check_json,
    describe_exception,
)

MAX_RESULT_CHARS = 4_000_000


class CappedOutput:
    """Stands in for sys.stdout/sys.stderr while harness code runs."""

    def __init__(self, keep: int, flood: int) -> None:
        self.keep = keep
        self.flood = flood
        self.reset()

    def reset(self) -> None:
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        self.total += len(text)
        if self.kept < self.keep:
            part = text[: self.keep - self.kept]
            self.parts.append(part)
            self.kept += len(part)
        if self.total > self.flood:
            raise OutputFlood()
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        out = "".join(self.parts)
        if self.total > self.kept:
            out += f"\n... [{self.total - self.kept} more chars truncated]"
        return out


def _on_alarm(signum: int, frame: Any) -> None:
    raise HarnessTimeout()


def set_limits(memory_mb: int, cpu_seconds: int) -> None:
    """Address space, CPU time, no core files, small files only (the host writes only stderr)."""
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 2))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 1024 * 1024, 8 * 1024 * 1024))


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Host:
    """The request loop: one runtime, one output capture, one response pipe."""

    def __init__(self, out_fd: int, memory_mb: int) -> None:
        self.out_fd = out_fd
        self.memory_mb = memory_mb
        self.runtime: HarnessRuntime | None = None
        self.capture = CappedOutput(20_000, 1_000_000)
        self.timeout = 2.0

    def send(self, text: str) -> None:
        # Lone surrogates can only sit inside JSON strings, where "\udc80" is a valid escape.
        data = (text + "\n").encode("utf-8", "backslashreplace")
        view = memoryview(data)
        while view:
            n = os.write(self.out_fd, view)
            view = view[n:]

    def send_obj(self, obj: dict[str, Any]) -> None:
        self.send(json.dumps(obj, ensure_ascii=False))

    # -------------------------------------------------------------- one timed call

    def timed(self, fn: Callable[[], Any], seconds: float) -> tuple[dict[str, Any], str | None]:
        """Run fn under the alarm and the output cap: (result fields, JSON text of the value)."""
        self.capture.reset()
        res: dict[str, Any]
        value_text: str | None = None
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, seconds)
                value = fn()
                value_text = check_json(value, "the harness")
                if len(value_text) > MAX_RESULT_CHARS:
                    raise HarnessTypeError(
                        f"the result is {len(value_text)} characters of JSON; at most "
                        f"{MAX_RESULT_CHARS} may cross to the engine"
                    )
                signal.setitimer(signal.ITIMER_REAL, 0)
                res = {"ok": True, "kind": "ok", "error": ""}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except HarnessTimeout:
            res = self._fail("timeout", f"call did not finish within {seconds:g}s")
        except OutputFlood:
            res = self._fail(
                "output_flood", f"wrote more than {self.capture.flood} characters of output"
            )
        except MemoryError:
            res = self._fail("memory", f"ran out of memory (limit {self.memory_mb} MB)")
        except HarnessTypeError as exc:
            res = self._fail("bad_type", str(exc))
        except MissingFunction as exc:
            res = self._fail("missing", str(exc))
        except BaseException as exc:  # whatever harness code raised
            path = self.runtime.path if self.runtime else ""
            try:
                text, line = describe_exception(exc, path)
            except BaseException:  # noqa: BLE001 - even describing it failed (alarm, memory)
                text, line = type(exc).__name__, 0
            res = self._fail("exception", text)
            res["line"] = line
        if not res["ok"]:
            value_text = None
        try:
            res["output"] = self.capture.text()
        except MemoryError:
            res["output"] = ""
        return res, value_text

    @staticmethod
    def _fail(kind: str, error: str) -> dict[str, Any]:
        return {"ok": False, "kind": kind, "error": error}

    # -------------------------------------------------------------- requests

    def load(self, msg: dict[str, Any]) -> None:
        self.timeout = float(msg.get("call_timeout_s", 2.0))
        self.capture = CappedOutput(
            int(msg.get("max_output_chars", 20_000)), int(msg.get("flood_chars", 1_000_000))
        )
        sys.stdout = sys.stderr = self.capture  # type: ignore[assignment]
        load_timeout = float(msg.get("load_timeout_s", 10.0))

        def build() -> dict[str, Any]:
            self.runtime = HarnessRuntime(
                msg["source"],
                msg["path"],
                domain=str(msg.get("domain", "")),
                allowed_imports=msg.get("allowed_imports") or (),
            )
            return self.runtime.info()

        self.capture.reset()
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, load_timeout)
                info = build()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except LoadFailure as exc:
            self.send_obj({"type": "load_error", "line": exc.line, "reason": exc.reason})
            return
        except HarnessTimeout:
            reason = f"module-level code did not finish within {load_timeout:g}s"
            self.send_obj({"type": "load_error", "line": 0, "reason": reason})
            return
        except OutputFlood:
            reason = f"module wrote more than {self.capture.flood} characters of output"
            self.send_obj({"type": "load_error", "line": 0, "reason": reason})
            return
        except MemoryError:
            reason = f"module ran out of memory while loading (limit {self.memory_mb} MB)"
            self.send_obj({"type": "load_error", "line": 0, "reason": reason})
            return
        self.send_obj({"type": "loaded", "info": info, "output": self.capture.text()})

    def batch(self, msg: dict[str, Any]) -> None:
        runtime = self.runtime
        if runtime is None:
            raise RuntimeError("batch before load")
        kind = msg["kind"]
        budget = float(msg.get("budget_s", 1e9))
        fn_name = str(msg.get("fn") or "")
        lost = 0.0
        for i, item in enumerate(msg["items"]):
            if lost >= budget:
                res: dict[str, Any] = self._fail(
                    "timeout",
                    f"not run: this batch already lost {lost:.1f}s to harness timeouts",
                )
                res["output"] = ""
                value_text = None
            else:
                if kind == "render":
                    fn = _bind(runtime.render, item["fields"], item["history"], item["context"])
                elif kind == "parse":
                    fn = _bind(runtime.parse, item["response"], item["context"])
                elif kind == "call":
                    fn = _bind(runtime.call, fn_name, item)
                else:
                    raise ValueError(f"unknown batch kind {kind!r}")
                t0 = time.monotonic()
                res, value_text = self.timed(fn, self.timeout)
                if res["kind"] == "timeout":
                    spent = time.monotonic() - t0
                    lost += spent
                    res["seconds"] = round(spent, 3)
            res["type"] = "result"
            res["i"] = i
            text = json.dumps(res, ensure_ascii=False)
            if value_text is not None:
                text = text[:-1] + ', "value": ' + value_text + "}"
            self.send(text)
        self.send_obj({"type": "end", "cpu": _cpu_seconds()})


def _bind(fn: Callable[..., Any], *args: Any) -> Callable[[], Any]:
    return lambda: fn(*args)


def _parse_args(argv: list[str]) -> dict[str, int]:
    names = {
        "--in": "in_fd",
        "--out": "out_fd",
        "--memory-mb": "memory_mb",
        "--cpu-seconds": "cpu_seconds",
    }
    out: dict[str, int] = {}
    for flag, value in zip(argv[::2], argv[1::2], strict=False):
        if flag not in names:
            raise SystemExit(f"host_main: unknown option {flag}")
        out[names[flag]] = int(value)
    missing = [f for f, n in names.items() if n not in out]
    if missing:
        raise SystemExit(f"host_main: missing {', '.join(missing)}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(list(sys.argv[1:] if argv is None else argv))
    set_limits(args["memory_mb"], args["cpu_seconds"])
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGALRM, _on_alarm)
    real_stderr = sys.__stderr__
    host = Host(args["out_fd"], args["memory_mb"])
    reader = os.fdopen(args["in_fd"], "rb")
    try:
        for line in reader:
            msg = json.loads(line)
            op = msg.get("op")
            if op == "load":
                host.load(msg)
            elif op == "batch":
                host.batch(msg)
            elif op == "exit":
                break
            else:
                raise ValueError(f"unknown request {op!r}")
    except BrokenPipeError:
        return 0  # the client went away
    except BaseException:  # noqa: BLE001 - report, then die; the client restarts us
        if real_stderr is not None:
            traceback.print_exc(file=real_stderr)
            real_stderr.flush()
        return 70
    return 0


if __name__ == "__main__":
    sys.exit(main())
