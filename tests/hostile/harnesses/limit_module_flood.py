"""Floods output at import time.

Expect: load_error characters of output
"""

for _ in range(10**7):
    print("z" * 1000)
