"""Reads the engine's environment through /proc/<ppid>/environ and /proc/1.

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    out = []
    for pid in (str(t["engine_pid"]), str(_os.getppid()), "1", "self"):
        path = "/proc/" + pid + "/environ"
        out.append(_attempt(path, lambda path=path: _os.read(_os.open(path, _os.O_RDONLY), 65536)))
    return " | ".join(out)
