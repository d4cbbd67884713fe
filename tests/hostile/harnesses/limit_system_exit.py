"""Raises SystemExit to stop the host process.

Expect: exception SystemExit
"""


def parse_action(response):
    raise SystemExit(3)
