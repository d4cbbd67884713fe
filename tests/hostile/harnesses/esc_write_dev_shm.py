"""Writes into /dev/shm, a writable place outside the scratch directory.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return _attempt("write", lambda: _os.open("/dev/shm/x", _os.O_WRONLY | _os.O_CREAT, 0o644))
