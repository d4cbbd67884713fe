"""Evaluates a string to get around the static check.

Expect: load_error forbidden name 'eval'
"""


def parse_action(response):
    return eval("__import__('os').getcwd()")
