"""Exits the host process from inside a call with os._exit.

Needs: os-confinement
Expect: crashed exited with status 0
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    _exit(0)
