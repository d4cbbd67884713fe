"""Lists the project checkout and the run folders.

Needs: os-confinement
Expect: blocked
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    t = json.loads(response)
    return _attempt("listdir", lambda: _os.listdir(t["repo"]))
