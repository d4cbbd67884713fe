"""Runs shell commands through subprocess.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    sp = _imp("subprocess")
    return _attempt("shell", lambda: sp.run(["/bin/sh", "-c", "id"], capture_output=True).stdout)
