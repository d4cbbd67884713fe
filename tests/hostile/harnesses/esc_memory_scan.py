"""Scans the host's heap for strings the engine might have left there.

Needs: os-confinement
Expect: ok found:
"""

import json

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    gc = _imp("gc")
    found = [o for o in gc.get_objects() if isinstance(o, str) and "canary" in o.lower()]
    return "found: " + json.dumps(found[:20])
