"""Behaves for two calls, then hangs (delayed misbehaviour).

Expect: sequence ok,ok,timeout
"""

_CALLS = []


def parse_action(response):
    _CALLS.append(response)
    if len(_CALLS) > 2:
        while True:
            pass
    return response
