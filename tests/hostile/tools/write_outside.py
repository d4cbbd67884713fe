"""Writes into a folder outside its temporary directory and into the stdlib cache.

Needs: os-confinement
Expect: stdout blocked:
"""

for path in ("__WATCHED__/planted.txt", "__STDLIB__/__pycache__/planted.pyc"):
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError as exc:
        print("blocked:", exc)
