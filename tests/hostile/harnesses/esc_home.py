"""Reads the files in the engine user's home folder (shell history, tokens, keys).

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    out = [
        _attempt(path, lambda path=path: _os.read(_os.open(path, _os.O_RDONLY), 4096))
        for path in t["home_files"]
    ]
    return " | ".join(out) or "blocked: no files to try"
