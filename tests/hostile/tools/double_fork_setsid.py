"""Leaves a double-forked setsid child alive after the tool call ends.

Needs: os-confinement
Expect: stdout blocked:
"""

import os
import time

try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(30)
        os._exit(0)
    print("detached")
except OSError as exc:
    print("blocked:", exc)
