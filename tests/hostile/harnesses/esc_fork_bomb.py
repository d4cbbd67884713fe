"""Forks many children that stay alive (bounded here at 50).

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    def bomb():
        kids = []
        for _ in range(50):
            pid = _os.fork()
            if pid == 0:
                _imp("time").sleep(30)
                _exit(0)
            kids.append(pid)
        return kids

    return _attempt("fork", bomb)
