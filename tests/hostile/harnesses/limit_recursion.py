"""Recurses without a base case.

Expect: exception RecursionError
"""


def _down(n):
    return _down(n + 1)


def parse_action(response):
    return _down(0)
