"""Imports ctypes to call libc directly.

Expect: load_error forbidden import 'ctypes'
"""

import ctypes


def parse_action(response):
    return str(ctypes.CDLL(None).getppid())
