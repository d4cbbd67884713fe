"""Raises a BaseException subclass to get past except Exception handlers.

Expect: exception Escape
"""


class Escape(BaseException):
    pass


def parse_action(response):
    raise Escape("past the handlers")
