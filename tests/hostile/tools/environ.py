"""Prints its environment, hoping the engine's variables (API keys) were inherited.

Expect: ok
"""

import os

print(dict(os.environ))
