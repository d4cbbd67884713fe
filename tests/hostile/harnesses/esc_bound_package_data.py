"""Looks for data or domain code next to the host's own modules.

Needs: os-confinement
Expect: blocked blocked: domains
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return (
        _attempt("data", lambda: _os.listdir("/whale/whale_lab/data"))
        + " | "
        + _attempt("domains", lambda: _os.listdir("/whale/whale_lab/domains"))
    )
