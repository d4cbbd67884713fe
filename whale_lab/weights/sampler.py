"""The one persistent prompt sampler of the weight phase.

WHALE draws weight-training prompts from a single sampler for the whole run, so prompts are not
revisited across phases: each epoch is a fresh seeded shuffle of the `weight` split, and no prompt
comes back until every prompt of the split has been drawn once. The position (epoch, offset) is
plain JSON, so it survives a resume exactly.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from whale_lab.errors import WhaleLabError


class SamplerStateError(WhaleLabError, ValueError):
    """A saved sampler position that does not fit the current split."""


def _fingerprint(ids: Sequence[str]) -> str:
    """A short digest of the split's ids, to catch a resume against a different split."""
    h = hashlib.sha256()
    for i in ids:
        h.update(i.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class SamplerPosition:
    epoch: int
    offset: int


class PromptSampler:
    """Seeded per-epoch shuffles over a fixed list of ids; `draw(n)` returns the next n indices."""

    def __init__(self, ids: Sequence[str], seed: int = 0) -> None:
        if not ids:
            raise ValueError("the weight split is empty: nothing to sample prompts from")
        if len(set(ids)) != len(ids):
            raise ValueError("the weight split has duplicate task ids")
        self.ids = list(ids)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0
        self.drawn = 0  # total prompts drawn over the sampler's life
        self._order_epoch = -1
        self._order: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def order(self, epoch: int) -> list[int]:
        """The permutation used in `epoch` (a function of seed and epoch only)."""
        if epoch != self._order_epoch:
            rng = random.Random(f"whale-lab-sampler:{self.seed}:{epoch}")
            order = list(range(len(self.ids)))
            rng.shuffle(order)
            self._order, self._order_epoch = order, epoch
        return self._order

    def draw(self, n: int) -> list[int]:
        """The next `n` indices; an epoch is finished before the next one starts."""
        if n < 1:
            raise ValueError("draw needs n >= 1")
        out: list[int] = []
        while len(out) < n:
            order = self.order(self.epoch)
            take = min(n - len(out), len(order) - self.offset)
            out.extend(order[self.offset : self.offset + take])
            self.offset += take
            self.drawn += take
            if self.offset >= len(order):
                self.epoch += 1
                self.offset = 0
        return out

    @property
    def epochs_done(self) -> float:
        """Prompts drawn so far, in epochs of the split (fractional)."""
        return self.drawn / len(self.ids)

    @property
    def position(self) -> SamplerPosition:
        return SamplerPosition(self.epoch, self.offset)

    def state_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "offset": self.offset,
            "drawn": self.drawn,
            "size": len(self.ids),
            "fingerprint": _fingerprint(self.ids),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a position; refuses one saved for a different split or seed."""
        try:
            size, fp = int(state["size"]), str(state["fingerprint"])
            seed, epoch = int(state["seed"]), int(state["epoch"])
            offset, drawn = int(state["offset"]), int(state["drawn"])
        except (KeyError, TypeError, ValueError) as exc:
            raise SamplerStateError(f"saved sampler state is incomplete: {exc}") from None
        if size != len(self.ids) or fp != _fingerprint(self.ids):
            raise SamplerStateError(
                f"saved sampler state was made for a different weight split ({size} tasks, "
                f"fingerprint {fp}); this run's split has {len(self.ids)} tasks "
                f"(fingerprint {_fingerprint(self.ids)}): the domain or its splits changed"
            )
        if seed != self.seed:
            raise SamplerStateError(f"saved sampler seed {seed} differs from run seed {self.seed}")
        if not 0 <= offset < size or epoch < 0 or drawn < 0:
            raise SamplerStateError(
                f"saved sampler position (epoch {epoch}, offset {offset}) is invalid"
            )
        self.epoch, self.offset, self.drawn = epoch, offset, drawn
