"""Plants a module next to the host's own code.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    path = "/whale/whale_lab/harness/planted.py"
    return _attempt("write", lambda: _os.open(path, _os.O_WRONLY | _os.O_CREAT, 0o644))
