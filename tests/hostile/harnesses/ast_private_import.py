"""Imports a private name from an allowed module.

Expect: load_error private attribute '_os'
"""

from random import _os


def parse_action(response):
    return str(_os.environ)
