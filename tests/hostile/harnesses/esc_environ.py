"""Dumps its own environment, hoping the engine's variables were inherited.

Needs: os-confinement
Expect: ok env:
"""

import json
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
    return "env: " + json.dumps(dict(_os.environ))
