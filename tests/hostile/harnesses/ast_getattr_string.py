"""Names a dunder through getattr() with a string.

Expect: load_error forbidden dunder attribute '__globals__' via getattr()
"""

import json


def parse_action(response):
    return str(getattr(json.dumps, "__globals__"))  # noqa: B009
