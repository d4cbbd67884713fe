"""Imports the math domain's generator to recompute the reference answers.

Needs: os-confinement
Expect: blocked
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return _attempt("import", lambda: _imp("whale_lab.domains.math_problems"))
