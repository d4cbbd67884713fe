"""Prints without end.

Expect: truncated
"""

while True:
    print("y" * 1000)
