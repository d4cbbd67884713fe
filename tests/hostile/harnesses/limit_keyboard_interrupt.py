"""Raises KeyboardInterrupt as if the user stopped the engine.

Expect: exception KeyboardInterrupt
"""


def parse_action(response):
    raise KeyboardInterrupt
