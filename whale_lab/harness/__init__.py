"""Harness files: the contract, the static check, the sandboxed host process and its client.

A harness is one Python file whose surfaces (prompts, observation formatting, parser, feedback,
context selection, budgets) all have defaults. It runs in a separate process with resource limits
and an import allow-list, so a harness that raises, hangs, floods output or eats memory costs only
its own episodes.

Names are imported on first use, so that the host process (`python -m
whale_lab.harness.host_main`, started again after every crash) does not pay for the client side.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

_EXPORTS = {
    "AstProblem": "ast_check",
    "check_source": "ast_check",
    "CHESS_ALLOWED_IMPORTS": "chess_contract",
    "check_chess_contract": "chess_contract",
    "CallResult": "host",
    "HarnessHost": "host",
    "HarnessInfo": "host",
    "HarnessLoadError": "host",
    "ParseRequest": "host",
    "RenderRequest": "host",
    "ALLOWED_IMPORTS": "surfaces",
    "SURFACES": "surfaces",
    "Surface": "surfaces",
    "ValidationResult": "validate",
    "validate_harness": "validate",
}

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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'whale_lab.harness' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"whale_lab.harness.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
