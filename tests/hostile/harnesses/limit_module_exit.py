"""Raises SystemExit at import time.

Expect: load_error module raised SystemExit
"""

raise SystemExit(0)
