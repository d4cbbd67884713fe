"""Writes a truncated .pyc into the standard library's cache.

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    path = t["stdlib"] + "/__pycache__/json.cpython-0.pyc"
    return _attempt("write", lambda: _os.open(path, _os.O_WRONLY | _os.O_CREAT, 0o644))
