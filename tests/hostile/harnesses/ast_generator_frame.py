"""Reads module globals through a generator's frame.

Expect: load_error forbidden attribute 'gi_frame'
"""


def _gen():
    yield 1


def parse_action(response):
    g = _gen()
    return str(g.gi_frame.f_back)
