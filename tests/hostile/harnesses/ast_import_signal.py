"""Imports signal to ignore the host's alarm.

Expect: load_error forbidden import 'signal'
"""

import signal

signal.signal(signal.SIGALRM, signal.SIG_IGN)


def parse_action(response):
    return response
