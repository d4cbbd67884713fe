"""Reaches os through a str.format field written as a literal.

Expect: load_error format field
"""

import random


def parse_action(response):
    return "{0.seed.__globals__[_os]}".format(random.Random())  # noqa: UP030, UP032
