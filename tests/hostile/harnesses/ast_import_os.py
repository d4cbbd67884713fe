"""Imports os to read the answers directly.

Expect: load_error forbidden import 'os'
"""

import os


def parse_action(response):
    return os.listdir("/")
