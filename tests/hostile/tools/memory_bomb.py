"""Allocates far more memory than the limit.

Expect: error MemoryError
"""

block = bytearray(8 * 1024**3)
print(len(block))
