"""The keys/values of finished rows, kept between calls so an episode's next turn prefills only
what is new.

A multi-turn episode's next prompt is usually its last prompt, the reply, and a new user message:
with the rows' caches kept, the next call computes the new tokens alone (the chess harness's
500-1,100-token boards, re-read at every turn for an 8-token reply, are most of a rollout's
work). Nothing is assumed about the prompts: a new prompt reuses only the longest token prefix it
shares, verified token by token, with a kept row, so a harness that rewrites its context (drops a
turn, edits the system prompt) just shares less, down to a full prefill.

The keys/values are a function of the weights, and the backend serves a model that the weight
phase updates in place: every call first compares a fingerprint of the weights (each parameter's
storage and in-place version counter, adapters switched on or off) with the one the cache was
filled under, and empties the cache when they differ. Memory is bounded by `max_bytes`; the least
recently used rows go first, and a row whose tokens a newer row extends is dropped for it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# Prompts are indexed by the hash of every whole block of their first tokens, so a lookup costs
# one pass over the prompt, whatever the number of rows kept.
BLOCK = 32
# A shared prefix shorter than this is recomputed: copying it would cost about as much.
MIN_REUSE = 32


@dataclass
class _Entry:
    tokens: list[int]
    kvs: list[tuple[Any, Any]]  # per layer (keys, values), each (heads, len(tokens), dim)
    nbytes: int
    keys: list[tuple[int, int]] = field(default_factory=list)  # its block index keys


def _block_keys(tokens: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """(length, chained hash) of each whole block of the first `limit` tokens."""
    keys: list[tuple[int, int]] = []
    h = 0
    for end in range(BLOCK, limit + 1, BLOCK):
        h = hash((h, tuple(tokens[end - BLOCK : end])))
        keys.append((end, h))
    return keys


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists (compared a block at a time)."""
    n = min(len(a), len(b))
    at = 0
    while at < n:
        end = min(n, at + BLOCK)
        if list(a[at:end]) != list(b[at:end]):
            for j in range(at, end):
                if a[j] != b[j]:
                    return j
        at = end
    return n


def weights_fingerprint(model: Any) -> tuple[Any, ...]:
    """What the keys/values depend on and the weight phase changes in place."""
    params = tuple((p.data_ptr(), p._version, p.dtype) for p in model.parameters())
    switches = tuple(
        (getattr(m, "_disable_adapters", None), str(getattr(m, "active_adapter", None)))
        for m in model.modules()
        if hasattr(m, "_disable_adapters")
    )
    return (id(model), params, switches)


@dataclass
class PrefixStats:
    """Prompt tokens that came from kept rows, and those computed."""

    hits: int = 0
    reused_tokens: int = 0
    lookups: int = 0
    evicted: int = 0
    cleared: int = 0

    def reset(self) -> None:
        self.hits = self.reused_tokens = self.lookups = self.evicted = self.cleared = 0


class PrefixCache:
    """Least-recently-used rows' keys/values, looked up by the longest verified token prefix."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self.stats = PrefixStats()
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._index: dict[tuple[int, int], set[int]] = {}
        self._tails: dict[tuple[int, int], set[int]] = {}  # by each row's last whole block
        self._next = 0
        self._fingerprint: tuple[Any, ...] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self._tails.clear()
        self.nbytes = 0

    def validate(self, model: Any) -> None:
        """Empty the cache unless it was filled under these very weights."""
        fingerprint = weights_fingerprint(model)
        if fingerprint != self._fingerprint:
            if self._entries:
                self.stats.cleared += 1
            self.clear()
            self._fingerprint = fingerprint

    def match(self, prompt: Sequence[int]) -> tuple[list[tuple[Any, Any]], int] | None:
        """The kept keys/values of the longest prefix `prompt` shares with a row, and its length.

        At least one token of the prompt is left to compute (its logits give the next token).
        """
        self.stats.lookups += 1
        best: tuple[int, int] | None = None
        limit = len(prompt) - 1
        for length, key in reversed(_block_keys(prompt, limit)):
            ids = self._index.get((length, key))
            if not ids:
                continue
            for i in ids:
                n = min(common_prefix(prompt, self._entries[i].tokens), limit)
                if best is None or n > best[1]:
                    best = (i, n)
            break
        if best is None or best[1] < MIN_REUSE:
            return None
        i, n = best
        self._entries.move_to_end(i)
        self.stats.hits += 1
        self.stats.reused_tokens += n
        return self._entries[i].kvs, n

    def put(self, tokens: list[int], kvs: list[tuple[Any, Any]]) -> None:
        """Keep one row: `kvs` per layer (heads, len(tokens), dim), owned by the cache from now."""
        if len(tokens) < MIN_REUSE + 1:
            return
        nbytes = sum(k.nbytes + v.nbytes for k, v in kvs)
        if nbytes > self.max_bytes:
            return
        keys = _block_keys(tokens, len(tokens))
        for key in keys:  # a kept row that this one extends is dropped for it
            for i in list(self._tails.get(key, ())):
                old = self._entries[i].tokens
                if len(old) <= len(tokens) and common_prefix(old, tokens) == len(old):
                    self._remove(i)
        entry = _Entry(tokens=list(tokens), kvs=kvs, nbytes=nbytes, keys=keys)
        i = self._next
        self._next += 1
        self._entries[i] = entry
        for k in keys:
            self._index.setdefault(k, set()).add(i)
        self._tails.setdefault(keys[-1], set()).add(i)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes and self._entries:
            oldest = next(iter(self._entries))
            self._remove(oldest)
            self.stats.evicted += 1

    def _remove(self, i: int) -> None:
        entry = self._entries.pop(i)
        self.nbytes -= entry.nbytes
        for table, keys in ((self._index, entry.keys), (self._tails, entry.keys[-1:])):
            for k in keys:
                ids = table.get(k)
                if ids is not None:
                    ids.discard(i)
                    if not ids:
                        del table[k]


def keep_ended(
    store: PrefixCache,
    layers: Sequence[Any],
    mask: Any,
    rows: Sequence[tuple[int, list[int]]],
) -> None:
    """Keep the rows `rows` ((row in the batch, the tokens its cache holds)) of a decode cache.

    A row's real columns are where its mask is 1 (left padding and the gaps between a shared
    prefix and a row's own tokens are not); a row whose count disagrees with its tokens is not
    kept, so a kept row always holds exactly its tokens' keys/values.
    """
    import torch

    for j, tokens in rows:
        cols = torch.nonzero(mask[j]).squeeze(1)
        if cols.numel() != len(tokens):
            continue
        store.put(tokens, [(layer.keys[j][:, cols], layer.values[j][:, cols]) for layer in layers])


def cache_from_kept(
    model: Any, kept: Sequence[tuple[list[tuple[Any, Any]], int]]
) -> tuple[Any, Any]:
    """A `DynamicCache` holding the first n columns of each kept row, left-padded, and its mask."""
    import torch
    from transformers import DynamicCache

    width = max(n for _, n in kept)
    cache = DynamicCache(config=model.config)
    first = kept[0][0]
    mask = torch.zeros((len(kept), width), dtype=torch.long, device=first[0][0].device)
    for j, (_, n) in enumerate(kept):
        mask[j, width - n :] = 1
    for layer_no, layer in enumerate(cache.layers):
        bufs = []
        for which in (0, 1):
            x0 = first[layer_no][which]
            buf = x0.new_zeros((len(kept), x0.shape[0], width, x0.shape[-1]))
            for j, (kvs, n) in enumerate(kept):
                buf[j, :, width - n :] = kvs[layer_no][which][:, :n]
            bufs.append(buf)
        layer.update(bufs[0], bufs[1])
    return cache, mask
