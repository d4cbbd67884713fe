"""Reads a planted answers file in a run folder by its absolute path.

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    return _attempt("read", lambda: _os.read(_os.open(t["canary"], _os.O_RDONLY), 4096))
