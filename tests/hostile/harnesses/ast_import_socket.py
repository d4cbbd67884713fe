"""Imports socket to reach a local inference server.

Expect: load_error forbidden import 'socket'
"""

import socket


def parse_action(response):
    socket.create_connection(("127.0.0.1", 8000))
    return ""
