"""Imports inspect to walk the caller's frames.

Expect: load_error forbidden import 'inspect'
"""

import inspect


def parse_action(response):
    return str(inspect.stack())
