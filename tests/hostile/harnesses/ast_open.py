"""Reads a verifier's answers with the open builtin.

Expect: load_error forbidden name 'open'
"""


def parse_action(response):
    with open("/etc/passwd") as fh:
        return fh.read()
