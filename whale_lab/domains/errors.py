"""Errors in a user's data files: always name the file, the line and what is wrong."""

from __future__ import annotations

from whale_lab.config import ConfigError


class DataError(ConfigError):
    """A malformed data source (file, row, server answer), phrased for the user."""
