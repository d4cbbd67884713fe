"""Calls fork and unshare through ctypes, past Python's own functions.

Needs: os-confinement
Expect: blocked
"""

import random
import string

_GOT = []
_D = "_" * 2


class _Grab(string.Formatter):
    """Receives the object a format field names, at C level: no AST rule or guard sees it."""

    def format_field(self, value, format_spec):
        _GOT.append(value)
        return ""


_GLOBALS = "{0.seed." + _D + "globals" + _D
_Grab().format(_GLOBALS + "[_os]}", random.Random())
_Grab().format(
    _GLOBALS + "[" + _D + "builtins" + _D + "][" + _D + "import" + _D + "]}", random.Random()
)
_Grab().format("{0." + _D[0] + "exit}", _GOT[0])
_os, _imp, _exit = _GOT


def _attempt(what, fn):
    try:
        got = fn()
    except BaseException as exc:  # the OS said no
        return f"blocked: {what}: {type(exc).__name__}: {exc}"
    return f"LEAK: {what}: {got!r:.300}"


def parse_action(response):
    ctypes = _imp("ctypes")
    libc = ctypes.CDLL(None, use_errno=True)

    def raw(nr, *args):
        rc = libc.syscall(nr, *args)
        if rc < 0:
            raise OSError(ctypes.get_errno(), _os.strerror(ctypes.get_errno()))
        if rc == 0 and nr != 272:
            _exit(0)  # a child, if fork ever worked
        return rc

    fork_nr, unshare_nr = (57, 272) if _os.uname().machine == "x86_64" else (220, 97)
    args = (17,) if fork_nr == 220 else ()
    first = _attempt("fork", lambda: raw(fork_nr, *args))
    second = _attempt("unshare", lambda: raw(unshare_nr, 0x10000000))
    return first + " | " + second
