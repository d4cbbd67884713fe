"""Grows a list of blocks until memory runs out.

Expect: memory
"""


def parse_action(response):
    blocks = []
    while True:
        blocks.append(bytearray(16 * 1024**2))
