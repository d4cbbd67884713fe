"""Prints without end to flood the engine's logs.

Expect: output_flood
"""


def parse_action(response):
    while True:
        print("x" * 10000)
