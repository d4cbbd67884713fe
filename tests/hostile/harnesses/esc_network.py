"""Connects to a local port (an inference server, the engine).

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    socket = _imp("socket")
    return _attempt("connect", lambda: socket.create_connection(("127.0.0.1", t["port"]), 2))
