"""Returns an object that is not JSON data.

Expect: bad_type
"""


def parse_action(response):
    return {"type": "answer", "content": {1, 2}}
