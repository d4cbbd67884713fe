"""Kills its parent process (the engine, without a PID namespace).

Needs: os-confinement
Expect: ok
"""

import os

os.kill(os.getppid(), 9)
print("sent")
