"""Reads a planted answers file by its absolute path.

Needs: os-confinement
Expect: stdout blocked:
"""

try:
    print(open("__CANARY__").read())
except OSError as exc:
    print("blocked:", exc)
