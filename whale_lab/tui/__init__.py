"""The Textual app (the only package that imports textual).

`run_tui` is importable without textual being loaded, so a CLI can import it at module level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from whale_lab.config import Config


def run_tui(cfg: Config, run_dir: str | None = None, *, replay_only: bool = False) -> int:
    """Open the app on a new run (run_dir None) or an existing run folder; return an exit code."""
    from whale_lab.tui.app import run_tui as _run_tui

    return _run_tui(cfg, run_dir, replay_only=replay_only)


__all__ = ["run_tui"]
