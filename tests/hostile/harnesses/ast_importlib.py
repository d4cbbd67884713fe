"""Uses importlib.import_module to load os by name.

Expect: load_error forbidden import 'importlib'
"""

from importlib import import_module


def parse_action(response):
    return import_module("o" + "s").getcwd()
