"""Fills the scratch directory to exhaust the machine's memory or disk.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    def fill():
        fd = _os.open("/tmp/fill", _os.O_WRONLY | _os.O_CREAT, 0o644)
        block = b"f" * (1 << 20)
        for _ in range(256):
            _os.write(fd, block)
        return "wrote 256 MB"

    return _attempt("fill", fill)
