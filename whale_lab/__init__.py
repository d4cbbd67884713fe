"""whale-lab: jointly optimise an LLM agent's weights and its harness (WHALE)."""

from whale_lab import ast_guard as _ast_guard

__version__ = "0.1.0"

# Before any of the package's threads start: see ast_guard for the CPython bug it works around.
_ast_guard.install()
