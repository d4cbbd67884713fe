"""Reads the package's data file to rebuild the splits and answers.

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    return _attempt("data", lambda: _os.read(_os.open(t["data"], _os.O_RDONLY), 4096))
