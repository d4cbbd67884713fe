"""Hangs at import time, before any call.

Expect: load_error did not finish
"""

while True:
    pass
