"""Imports gc to find the host's objects in memory.

Expect: load_error forbidden import 'gc'
"""

import gc


def parse_action(response):
    return str(len(gc.get_objects()))
