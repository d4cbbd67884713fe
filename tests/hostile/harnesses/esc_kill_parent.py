"""Kills its parent (the engine, without a PID namespace) and then every process it can see.

Needs: os-confinement
Expect: ok sent:
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    _os.kill(_os.getppid(), 9)
    _os.kill(1, 9)
    return "sent: " + str(_os.getppid())
