"""Hangs inside C code that never returns to the interpreter, so the host's alarm cannot fire.

Expect: timeout restarted
"""

import itertools


def parse_action(response):
    return str((-1) in itertools.repeat(0, 10**13))
