"""Ignores SIGALRM so that the host's time limit never fires, then loops.

Needs: os-confinement
Expect: timeout restarted
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    signal = _imp("signal")
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:
        pass
