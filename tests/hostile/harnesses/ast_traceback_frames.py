"""Walks an exception's traceback up to the host's frames.

Expect: load_error forbidden dunder attribute '__traceback__'
"""


def parse_action(response):
    try:
        return str(1 / 0)
    except ZeroDivisionError as exc:
        return str(exc.__traceback__.tb_frame.f_back.f_globals)
