"""Walks object.__subclasses__() to find a class with os in its globals.

Expect: load_error forbidden dunder attribute '__class__'
"""


def parse_action(response):
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "_wrap_close":
            return str(cls.__init__.__globals__["system"])
    return ""
