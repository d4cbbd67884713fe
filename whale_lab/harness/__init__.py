"""Harness files: the contract, the static check, the sandboxed host process and its client.

A harness is one Python file whose surfaces (prompts, observation formatting, parser, feedback,
context selection, budgets) all have defaults. It runs in a separate process with resource limits
and an import allow-list, so a harness that raises, hangs, floods output or eats memory costs only
its own episodes.

Every module here uses only the standard library and `whale_lab.config`, so importing the package
eagerly stays cheap for the host process (`python -m whale_lab.harness.host_main`, started again
after every crash) and pulls in no ML or TUI stack.
"""

from __future__ import annotations

from whale_lab.harness.ast_check import AstProblem, check_source
from whale_lab.harness.chess_contract import CHESS_ALLOWED_IMPORTS, check_chess_contract
from whale_lab.harness.host import (
    CallResult,
    HarnessHost,
    HarnessInfo,
    HarnessLoadError,
    ParseRequest,
    RenderRequest,
)
from whale_lab.harness.surfaces import ALLOWED_IMPORTS, SURFACES, Surface
from whale_lab.harness.validate import ValidationResult, validate_harness

__all__ = [
    "ALLOWED_IMPORTS",
    "CHESS_ALLOWED_IMPORTS",
    "SURFACES",
    "AstProblem",
    "CallResult",
    "HarnessHost",
    "HarnessInfo",
    "HarnessLoadError",
    "ParseRequest",
    "RenderRequest",
    "Surface",
    "ValidationResult",
    "check_chess_contract",
    "check_source",
    "validate_harness",
]
