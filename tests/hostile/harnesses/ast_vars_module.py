"""Reads a module's namespace with vars().

Expect: load_error forbidden name 'vars'
"""

import json


def parse_action(response):
    return str(vars(json))
