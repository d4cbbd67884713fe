"""Imports subprocess to run a shell.

Expect: load_error forbidden import 'subprocess'
"""

import subprocess


def parse_action(response):
    return subprocess.check_output(["id"]).decode()
