"""The decode cache of the refill scheduler: left-padded rows in slabs with spare columns.

Each layer's keys/values live in a buffer wider than the columns in use (`SlabLayer`), so a decode
step writes its new column in place (a plain `DynamicLayer` copies the whole cache at every step);
rows that end are dropped and the leading columns no remaining row uses are trimmed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def first_used(mask: Any) -> int:
    """The first column any row uses."""
    import torch

    used = torch.nonzero(mask.any(dim=0))
    return int(used[0, 0]) if len(used) else 0


# Spare columns a decode cache keeps for the next steps: appending writes in place instead of
# copying the whole cache at every step (which `DynamicLayer` does); it grows by this much.
SLAB_ROOM = 256
_SLAB: Any = None


def slab_cache(
    model: Any,
    pieces: Sequence[tuple[list[tuple[Any, Any]], Any, list[list[int]]]],
    room: int,
    rows: int,
) -> tuple[Any, Any]:
    """One `DynamicCache` of `rows` rows, left-padded to the longest piece, whose layers append
    in place into `room` spare columns; and its mask. A piece's row r is written to each row of
    its `dests[r]`, straight from the piece (so each copy of a duplicate is made once)."""
    import torch
    from transformers import DynamicCache

    room = max(1, min(room, SLAB_ROOM))
    length = max(m.shape[-1] for _, m, _ in pieces)
    first_mask = pieces[0][1]
    mask = first_mask.new_zeros((rows, length))
    plans = []  # per piece: a contiguous destination range, or (source, destination) pairs
    for _, m, dests in pieces:
        flat = [(r, d) for r, ds in enumerate(dests) for d in ds]
        src = torch.tensor([r for r, _ in flat], device=m.device)
        dst = torch.tensor([d for _, d in flat], device=m.device)
        mask[dst, length - m.shape[-1] :] = m[src]
        lo = flat[0][1] if flat else 0
        straight = flat == [(r, lo + r) for r in range(m.shape[0])]
        plans.append((lo, m.shape[0]) if straight else flat)
    cache = DynamicCache(config=model.config)
    slab = slab_layer()
    layers = []
    for j in range(len(pieces[0][0])):
        bufs = []
        for which in (0, 1):
            first = pieces[0][0][j][which]
            # Uninitialised, but for the left padding: masked columns must hold finite values
            # (a zero attention weight times NaN is NaN); the spare room is written before read.
            buf = first.new_empty((rows, first.shape[1], length + room, first.shape[-1]))
            for (kv, _, _), plan in zip(pieces, plans, strict=True):
                x = kv[j][which]
                pad = length - x.shape[-2]
                if isinstance(plan, tuple):
                    buf[plan[0] : plan[0] + plan[1], :, pad:length] = x
                    buf[plan[0] : plan[0] + plan[1], :, :pad] = 0
                else:
                    for r, d in plan:
                        buf[d, :, pad:length] = x[r]
                        buf[d, :, :pad] = 0
            bufs.append(buf)
        layers.append(slab(bufs[0], bufs[1], length))
    cache.layers = layers
    return cache, mask


def slab_layer() -> Any:
    """The in-place layer class (defined on first use: transformers loads only when generating)."""
    global _SLAB
    if _SLAB is not None:
        return _SLAB
    from transformers.cache_utils import DynamicLayer

    class SlabLayer(DynamicLayer):  # type: ignore[misc]
        """A `DynamicLayer` whose keys/values are views of a buffer with spare columns."""

        def __init__(self, buf_k: Any, buf_v: Any, used: int) -> None:
            super().__init__()
            self.lazy_initialization(buf_k, buf_v)
            self.buf_k, self.buf_v, self.used = buf_k, buf_v, used
            self._view()

        def _grow(self, room: int) -> None:
            rows, heads, _, dim = self.buf_k.shape
            k = self.buf_k.new_empty((rows, heads, self.used + room, dim))
            v = self.buf_v.new_empty(
                (rows, self.buf_v.shape[1], self.used + room, self.buf_v.shape[-1])
            )
            k[:, :, : self.used] = self.keys
            v[:, :, : self.used] = self.values
            self.buf_k, self.buf_v = k, v

        def _view(self) -> None:
            self.keys = self.buf_k[:, :, : self.used]
            self.values = self.buf_v[:, :, : self.used]

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            n = key_states.shape[-2]
            if self.used + n > self.buf_k.shape[-2]:
                self._grow(max(n, SLAB_ROOM))
            self.buf_k[:, :, self.used : self.used + n] = key_states
            self.buf_v[:, :, self.used : self.used + n] = value_states
            self.used += n
            self._view()
            return self.keys, self.values

        def batch_select_indices(self, indices: Any) -> None:
            self.buf_k, self.buf_v = self.buf_k[indices], self.buf_v[indices]
            self._view()

        def trim_left(self, first: int) -> None:
            self.buf_k, self.buf_v = self.buf_k[:, :, first:], self.buf_v[:, :, first:]
            self.used -= first
            self._view()

    _SLAB = SlabLayer
    return _SLAB


def drop_rows(
    cache: Any, mask: Any, last: Any, pos: Any, batch: list[int], done: Sequence[bool]
) -> tuple[Any, Any, Any, Any, list[int]]:
    """Remove the rows that ended, and the leading columns no remaining row uses."""
    import torch

    if not any(done):
        return cache, mask, last, pos, batch
    keep = [j for j, d in enumerate(done) if not d]
    if not keep:
        return None, None, None, None, []
    idx = torch.tensor(keep, device=mask.device)
    cache.batch_select_indices(idx)
    mask, last, pos = mask[idx], last[idx], pos[idx]
    first = first_used(mask)
    if first > 0:
        for layer in cache.layers:
            layer.trim_left(first)
        mask = mask[:, first:]
    return cache, mask, last, pos, [batch[j] for j in keep]
