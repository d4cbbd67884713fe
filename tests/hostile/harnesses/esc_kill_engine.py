"""Kills the engine with os.kill(<engine pid>, SIGKILL).

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    return _attempt("kill", lambda: _os.kill(t["engine_pid"], 9))
