"""Reaches the real builtins through globals().

Expect: load_error forbidden name 'globals'
"""


def parse_action(response):
    return str(globals()["__builtins__"])
