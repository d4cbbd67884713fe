"""Allocates far more memory than the limit.

Expect: memory
"""


def parse_action(response):
    return str(len(bytearray(8 * 1024**3)))
