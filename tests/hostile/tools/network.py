"""Connects to a local port (a local inference server).

Needs: os-confinement
Expect: stdout blocked:
"""

import socket

try:
    socket.create_connection(("127.0.0.1", int("__PORT__")), 2)
    print("connected")
except OSError as exc:
    print("blocked:", exc)
