"""The root of errors caused by a user's input or environment.

The CLI and the TUI print these as one readable line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class WhaleLabError(Exception):
    """A problem the user can act on: names what is wrong and where."""


class BackendError(WhaleLabError, RuntimeError):
    """A backend problem a user can act on (server down, model folder unusable, ...).

    Defined here, below the backends, so model presets (which backends load) can raise it too.
    """
