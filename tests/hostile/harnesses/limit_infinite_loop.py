"""Loops forever in Python code.

Expect: timeout
"""


def parse_action(response):
    while True:
        pass
