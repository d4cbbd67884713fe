"""Domain registry: a plain dict from name to a factory taking the config."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from whale_lab.config import Config
    from whale_lab.domains.base import Domain


def _math(cfg: Config) -> Domain:
    from whale_lab.domains.math import MathDomain

    return MathDomain.from_config(cfg)


def _search(cfg: Config) -> Domain:
    from whale_lab.domains.search import SearchDomain

    return SearchDomain.from_config(cfg)


def _chess(cfg: Config) -> Domain:
    from whale_lab.domains.chess import ChessDomain

    return ChessDomain.from_config(cfg)


DOMAINS: dict[str, Callable[[Config], Domain]] = {"math": _math, "search": _search, "chess": _chess}


def make_domain(cfg: Config) -> Domain:
    return DOMAINS[cfg.domain.name](cfg)
