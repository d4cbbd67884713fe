"""Reads system files such as /etc/passwd.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return _attempt("passwd", lambda: _os.read(_os.open("/etc/passwd", _os.O_RDONLY), 4096))
