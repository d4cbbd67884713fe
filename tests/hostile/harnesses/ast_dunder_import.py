"""Calls __import__ to get os.

Expect: load_error forbidden name '__import__'
"""


def parse_action(response):
    return __import__("os").getcwd()
