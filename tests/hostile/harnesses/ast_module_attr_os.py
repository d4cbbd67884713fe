"""Takes os from an allowed module's attribute.

Expect: load_error private attribute '_os'
"""

import random


def parse_action(response):
    return str(random._os.environ)
