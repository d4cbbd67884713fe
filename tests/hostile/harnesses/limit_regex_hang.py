"""Backtracks catastrophically in the regex engine (C code; it checks for signals since 3.11).

Expect: timeout
"""

import re


def parse_action(response):
    return str(re.match(r"(a+)+$", "a" * 64 + "b"))
