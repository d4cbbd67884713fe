"""Imports a sibling module of the host relatively.

Expect: load_error relative imports are not allowed
"""

from . import host_main


def parse_action(response):
    return str(host_main)
