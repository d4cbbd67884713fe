"""The math domain's `python` tool: run model-written code in a limited child process.

Model code is untrusted and often wrong, so it runs in a fresh interpreter in its own session
(killed as a group), in an empty temporary folder, with a wall-time limit, an address-space limit
(RLIMIT_AS), a CPU-time limit, and a file-size limit that also caps how much it can print. The
engine never waits longer than the wall limit and never holds more output than the cap.

Where the machine allows it the process is also confined by the operating system
(`whale_lab.confine`): no network, its own PID namespace, a read-only view of the interpreter and
its standard library only (so no whale_lab, no data, no run folder), a private /tmp. The
interpreter runs without site-packages and writes no bytecode in either case.

`run_python` starts one such process per call (the cold path). The math environment keeps a warm
worker per episode instead (`tool_worker.py`: the same sandbox and limits, code sent over a pipe);
both report through `outcome`, so a call reads the same whichever path ran it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from whale_lab import confine

# Where the model's code file appears inside a confined view.
CODE_PATH = "/code/main.py"

# Runs inside the child: set limits, then execute the user's code as __main__ with a clean
# traceback (no frames of this wrapper) and the source visible in it.
_WRAPPER = r"""
import linecache, resource, sys, traceback
mem, cpu, fsize, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mem > 0:
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
with open(path, encoding="utf-8") as fh:
    src = fh.read()
name = "<python>"
linecache.cache[name] = (len(src), None, src.splitlines(True), name)
sys.argv = [name]
try:
    code = compile(src, name, "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as exc:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != name:
        tb = tb.tb_next
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    traceback.print_exception(type(exc), exc, tb)
    sys.exit(1)
"""


@dataclass(frozen=True)
class InterpreterLimits:
    """Resource limits for one run of model code."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_chars: int = 2000
    # Run with resource limits only where bwrap cannot confine (else ConfinementError).
    allow_unconfined: bool = False


@dataclass(frozen=True)
class PythonResult:
    stdout: str
    error: str  # "" when the code ran cleanly; else a short traceback or the limit it hit
    timed_out: bool = False
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.error


def _read_capped(path: Path, max_chars: int) -> tuple[str, bool]:
    with open(path, "rb") as fh:
        return decode_capped(fh.read(max_chars * 4 + 4), max_chars)


def decode_capped(data: bytes, max_chars: int) -> tuple[str, bool]:
    """At most `max_chars` characters of output read as up to `max_chars * 4 + 4` bytes, and
    whether there was more."""
    text = data.decode("utf-8", errors="replace")
    if len(text) > max_chars:
        return text[:max_chars], True
    return text, len(data) > max_chars * 4


def _tail(text: str, max_chars: int) -> str:
    text = text.strip()
    if len(text) <= max_chars:
        return text
    return "..." + text[-max_chars:]


@dataclass(frozen=True)
class ProcessLimits:
    """The numbers handed to the interpreter for one set of InterpreterLimits."""

    memory_bytes: int  # RLIMIT_AS (0: none)
    cpu_s: int  # RLIMIT_CPU per call
    file_bytes: int  # RLIMIT_FSIZE: caps each output file a little above what is read back
    env: dict[str, str]  # extra environment: one thread for numeric libraries


def process_limits(limits: InterpreterLimits) -> ProcessLimits:
    """One reading of the limits for the cold and the warm path, so both apply the same."""
    mem = limits.memory_mb * 1024 * 1024 if limits.memory_mb > 0 else 0
    cpu = max(1, int(limits.timeout_s) + 1)
    fsize = max(4096, limits.max_output_chars * 4 + 1024)
    threads = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return ProcessLimits(mem, cpu, fsize, threads)


def unconfined_env(home: str, extra: dict[str, str]) -> dict[str, str]:
    """The environment of an unconfined interpreter: nothing of the engine's but PATH."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }


def run_python(code: str, limits: InterpreterLimits | None = None) -> PythonResult:
    """Run `code` in a fresh Python with limits; never raises for anything the code does.

    Raises ConfinementError only when confinement is required and this machine cannot confine.
    """
    limits = limits or InterpreterLimits()
    conf = confine.enforce(limits.allow_unconfined, "tool code")
    max_chars = limits.max_output_chars
    with tempfile.TemporaryDirectory(prefix="whale-py-", ignore_cleanup_errors=True) as tmp:
        tmp_path = Path(tmp)
        src = tmp_path / "main.py"
        src.write_text(code, encoding="utf-8")
        out_path, err_path = tmp_path / "stdout", tmp_path / "stderr"
        lim = process_limits(limits)
        limit_args = [str(lim.memory_bytes), str(lim.cpu_s), str(lim.file_bytes)]
        # -I: no environment, no user site, no script folder; -S: no site-packages (no whale_lab);
        # -B: no bytecode written anywhere.
        wrapped: confine.Wrapped | None = None
        if conf.confined:
            env = confine.clean_env(lim.env)
            cmd = [confine.python_executable(), "-I", "-S", "-B", "-c", _WRAPPER]
            wrapped = confine.wrap(
                [*cmd, *limit_args, CODE_PATH],
                bwrap=conf.bwrap,
                env=env,
                binds=[(str(src), CODE_PATH)],
            )
            cmd, fds = wrapped.argv, wrapped.pass_fds
        else:
            env = unconfined_env(tmp, lim.env)
            cmd = [sys.executable, "-I", "-S", "-B", "-c", _WRAPPER, *limit_args, str(src)]
            fds = ()
        timed_out = False
        with open(out_path, "wb") as out_fh, open(err_path, "wb") as err_fh:
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=tmp,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out_fh,
                    stderr=err_fh,
                    pass_fds=fds,
                    start_new_session=True,
                )
            finally:
                if wrapped is not None:
                    wrapped.close()
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                proc.wait()
        stdout, truncated = _read_capped(out_path, max_chars)
        stderr, _ = _read_capped(err_path, max_chars)
    return outcome(stdout, truncated, stderr, proc.returncode, timed_out, conf.confined, limits)


def outcome(
    stdout: str,
    truncated: bool,
    stderr: str,
    rc: int,
    timed_out: bool,
    confined: bool,
    limits: InterpreterLimits,
) -> PythonResult:
    """The result of one run from what it printed and how it ended: one wording for every path."""
    max_chars = limits.max_output_chars
    cpu = process_limits(limits).cpu_s
    if truncated:
        stdout += f"\n... [output truncated at {max_chars} characters]"
    if timed_out:
        error = f"TimeoutError: the code ran longer than {limits.timeout_s:g} s and was stopped"
    elif rc == 0:
        error = ""
    elif (sig := confine.exit_signal(rc, confined)) is not None:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        if sig == signal.SIGXCPU:
            error = f"TimeoutError: the code used more than {cpu} s of CPU time and was stopped"
        elif sig == signal.SIGKILL:
            error = (
                f"MemoryError: the process was killed (limit {limits.memory_mb} MB)"
                if not stderr.strip()
                else _tail(stderr, 800)
            )
        else:
            error = f"the process was killed by signal {name}"
    else:
        error = _tail(stderr, 800) or f"the process exited with status {rc}"
        if "File too large" in error or "EFBIG" in error:
            error = f"OutputLimit: the code printed more than {max_chars} characters"
    return PythonResult(stdout=stdout, error=error, timed_out=timed_out, truncated=truncated)
