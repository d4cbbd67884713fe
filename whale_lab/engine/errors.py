"""The engine's one user-facing error type."""

from __future__ import annotations

from whale_lab.errors import WhaleLabError


class EngineError(WhaleLabError, RuntimeError):
    """A problem with a run folder a user can act on (missing, foreign, already open)."""
