"""The config of a run nobody reviews: `approval.mode` becomes `approval.headless_mode`.

Used by every run started without the app (`whale-lab run --headless`, `resume`, `probe`) and by
each run of a comparison. The command-line entry points themselves are in `whale_lab.commands`.
"""

from __future__ import annotations

import dataclasses

from whale_lab.config import Config


def headless_config(cfg: Config) -> Config:
    """The config with `approval.mode` set to `approval.headless_mode`."""
    return cfg.replace(approval=dataclasses.replace(cfg.approval, mode=cfg.approval.headless_mode))
