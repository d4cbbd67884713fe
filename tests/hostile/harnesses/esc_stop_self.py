"""Sends itself SIGSTOP so that the host hangs without using CPU.

Needs: os-confinement
Expect: timeout restarted
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    _os.kill(_os.getpid(), _imp("signal").SIGSTOP)
    return "woke"
