"""Calls fork and unshare through ctypes, past Python's own functions.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    ctypes = _imp("ctypes")
    libc = ctypes.CDLL(None, use_errno=True)

    def raw(nr, *args):
        rc = libc.syscall(nr, *args)
        if rc < 0:
            raise OSError(ctypes.get_errno(), _os.strerror(ctypes.get_errno()))
        if rc == 0 and nr != 272:
            _exit(0)  # a child, if fork ever worked
        return rc

    fork_nr, unshare_nr = (57, 272) if _os.uname().machine == "x86_64" else (220, 97)
    args = (17,) if fork_nr == 220 else ()
    first = _attempt("fork", lambda: raw(fork_nr, *args))
    second = _attempt("unshare", lambda: raw(unshare_nr, 0x10000000))
    return first + " | " + second
