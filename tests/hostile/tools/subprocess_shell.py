"""Runs a shell command.

Needs: os-confinement
Expect: stdout blocked:
"""

import subprocess

try:
    print(subprocess.run(["/bin/sh", "-c", "id"], capture_output=True).stdout)
except OSError as exc:
    print("blocked:", exc)
