"""Returns a result too large to cross to the engine.

Expect: bad_type at most
"""


def parse_action(response):
    return "y" * 5_000_000
