"""Loops forever.

Expect: error TimeoutError
"""

while True:
    pass
