"""Fills its scratch space with many files.

Needs: os-confinement
Expect: stdout blocked:
"""

n = 0
try:
    for i in range(100000):
        with open(f"f{i}", "wb") as fh:
            fh.write(b"x" * 4000)
        n += 1
    print("wrote", n)
except OSError as exc:
    print("blocked:", type(exc).__name__, n)
