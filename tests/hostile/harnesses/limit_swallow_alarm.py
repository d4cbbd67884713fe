"""Catches the alarm's exception and keeps looping.

Expect: timeout
"""


def parse_action(response):
    while True:
        try:
            while True:
                pass
        except BaseException:
            pass
