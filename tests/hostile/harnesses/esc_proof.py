"""Shows the Python-level layers are bypassed: the real os module and __import__ are reached.

Needs: os-confinement
Expect: ok escaped: module True True
"""

# hostile: escape (tests/hostile/escape_prelude.py.txt: _os, _imp, _exit, _attempt)


def parse_action(response):
    return f"escaped: {type(_os).__name__} {callable(_imp)} {hasattr(_os, 'fork')}"
