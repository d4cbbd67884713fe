"""Dumps its own environment, hoping the engine's variables were inherited.

Needs: os-confinement
Expect: ok env:
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return "env: " + json.dumps(dict(_os.environ))
