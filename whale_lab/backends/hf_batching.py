"""Continuous batching for the in-process backend: finished rows leave, waiting prompts join.

Why a scheduler of our own. transformers' own continuous batching (`model.generate_batch`,
`ContinuousBatchingManager`, transformers 5.24) runs on CPU, with a peft LoRA model attached too,
but on the micro model it took 5-8x the CPU time of one padded `model.generate` per chunk for the
same 128 prompts (paged attention and a background thread made for GPUs). It also seeds one RNG for
the whole manager (a row's sample depends on its neighbours), returns log-probabilities after
temperature, and knows no stop strings. So this module drives the model's forward itself.

How it runs. At most `width` rows decode together over one `DynamicCache` whose tensors are
left-padded to a common length, with a 2-D attention mask saying which columns are real.
- A row leaves as soon as it samples an EOS id, completes a stop string, or reaches its own token
  budget: its cache rows and mask row are dropped (`batch_select_indices`), and columns that no
  remaining row uses are trimmed from the left, so no step computes a row that has ended.
- Waiting prompts join when at least `refill` slots are free (or the batch is empty). Admitting
  a row costs a prefill forward and one copy of the batch's cache, so rows join in groups rather
  than one per step. Waiting prompts are taken longest first. The newcomers' prefill computes
  identical prompts (the k samples of a task's first turn) once, and a long prefix common to
  several prompts (the same samples a turn later) once, then each row's own suffix on a copy of
  that prefix's cache. Rows go through the model in buckets of similar length, so little of a
  prefill forward is padding. The new rows and the running ones are then copied, left-padded to a
  common length, into one cache.
- The cache layers (`hf_slab.SlabLayer`) keep spare columns after the used ones, so a decode step
  writes its new keys/values in place; a plain `DynamicLayer` copies the whole cache at every step.
- With a `PrefixCache` (`hf_prefix_cache`), every row that ends is kept there, and a newcomer whose
  prompt extends a kept row (the same episode a turn later) computes only its new tokens.
Positions are per row (padding takes none), as `model.generate` computes them from the mask, so a
row computes what the same prompt computes alone, up to float rounding from padding and prefix
reuse (~1e-6 on the logits; `model.generate`'s own left padding does the same): greedy output
equals sequential generation in the tests and on every benchmark prompt.

Sampling is per row. Each row draws its uniforms from its own `random.Random`, seeded from the
prompt's own seed (`Prompt.seed`, which the rollout derives per episode and turn) or else from the
call's seed and the row's index in the call, and samples by inverse CDF from the distribution that
transformers' temperature / top-k / top-p warpers leave. A seeded row's sample therefore does not
depend on what else is in the batch, on the batch size, or on when it joined (with one RNG shared
by the batch, as `model.generate` has, it would depend on all three).

Supported: decoder-only transformers models with sdpa or eager attention, plain `DynamicLayer`
caches and a generation config that asks for no logits processing beyond temperature / top-k /
top-p (`supports_refill`); the backend keeps its padded `model.generate` path for the rest.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from whale_lab.backends.hf_prefix_cache import (
    PrefixCache,
    cache_from_kept,
    common_prefix,
    keep_ended,
)
from whale_lab.backends.hf_slab import drop_rows, first_used, slab_cache

# Generation-config fields that would add logits processors in `model.generate`, with the value
# that adds none. A model whose own generation config sets any of them keeps the padded path.
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "repetition_penalty": (None, 1.0),
    "no_repeat_ngram_size": (None, 0),
    "encoder_repetition_penalty": (None, 1.0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "bad_words_ids": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "sequence_bias": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "remove_invalid_values": (None, False),
    "exponential_decay_length_penalty": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "guidance_scale": (None, 1.0),
    "watermarking_config": (None,),
    "renormalize_logits": (None, False),
    "min_p": (None,),
    "top_h": (None,),
    "typical_p": (None, 1.0),
    "epsilon_cutoff": (None, 0.0),
    "eta_cutoff": (None, 0.0),
}


@dataclass
class DecodeStats:
    """How much of the decode work carried real tokens.

    A decode step is one forward that feeds one new token per row; the first token of a row comes
    from its prefill and counts in none of these. `slots` are the rows a step computes plus the
    free rows it leaves empty while prompts wait, so padding, finished rows kept in the batch and
    slots held back from waiting prompts all count as unused: `slot_use` = tokens / slots.
    `capacity` is the full batch width at every step (the chunk's rows for the padded path,
    `min(batch_size, prompts)` for the refill scheduler): `fill` = tokens / capacity also counts
    the tail of a call, when nothing is left to wait and the batch drains.
    """

    tokens: int = 0
    slots: int = 0
    capacity: int = 0
    decode_steps: int = 0
    prefills: int = 0

    @property
    def slot_use(self) -> float:
        return self.tokens / self.slots if self.slots else 0.0

    @property
    def fill(self) -> float:
        return self.tokens / self.capacity if self.capacity else 0.0

    def reset(self) -> None:
        self.tokens = self.slots = self.capacity = self.decode_steps = self.prefills = 0


@dataclass
class Request:
    """One prompt to complete; `tokens` and `logprobs` fill in as it decodes."""

    prompt: list[int]
    budget: int
    rng: random.Random | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


def row_rngs(
    n: int, seed: int | None, seeds: Sequence[int | None] | None = None
) -> list[random.Random]:
    """One RNG per row: from the row's own seed where `seeds` gives one (a prompt's seed, the
    same whatever its place in the call), else from the call's seed and the row's index;
    without either, one draw from torch's global RNG for the call."""
    import torch

    own = list(seeds) if seeds is not None else [None] * n
    if len(own) != n:
        raise ValueError(f"row_rngs: {len(own)} seeds for {n} rows")
    if seed is None and any(s is None for s in own):
        seed = int(torch.randint(0, 2**62, ()).item())
    return [
        random.Random(f"whale-lab:{seed}:{row}" if s is None else f"whale-lab:prompt:{s}")
        for row, s in enumerate(own)
    ]


def supports_refill(model: Any) -> bool:
    """Whether the refill scheduler computes what `model.generate` would for this model.

    It needs a decoder-only model whose forward takes a cache (`cache`, or `past_key_values`
    before transformers renamed it), `position_ids` and
    `logits_to_keep`, an attention that reads any 2-D padding mask (sdpa, eager), plain
    `DynamicLayer` cache layers (no sliding window or recurrent state), and a generation config
    that asks for no logits processing beyond temperature / top-k / top-p.
    """
    import inspect

    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    gen = getattr(model, "generation_config", None)
    for name, neutral in _NEUTRAL.items():
        if getattr(gen, name, None) not in neutral:
            return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    try:
        accepted = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
    if not {"position_ids", "logits_to_keep"} <= set(accepted) or cache_kwarg(base) is None:
        return False
    try:
        cache = DynamicCache(config=config)
    except Exception:  # a config the cache cannot read: model.generate knows the model better
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def cache_kwarg(model: Any) -> str | None:
    """The name the model's forward takes its key/value cache by: `cache` in current
    transformers, `past_key_values` before (the GPU images' 5.17 among them). Passed under the
    other name the cache would be ignored, and every decode step would see no context."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    try:
        accepted = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return None
    for name in ("cache", "past_key_values"):
        if name in accepted:
            return name
    return None


class Sampler:
    """Greedy argmax, or per-row inverse-CDF sampling after transformers' own warpers."""

    def __init__(self, temperature: float, top_k: int, top_p: float) -> None:
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.greedy = temperature == 0.0
        self.warpers = LogitsProcessorList()
        if not self.greedy:  # the order and conditions of `model.generate`
            if temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k != 0:
                self.warpers.append(TopKLogitsWarper(top_k=top_k, min_tokens_to_keep=1))
            if top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))

    def pick(self, logits: Any, rngs: Sequence[random.Random | None]) -> Any:
        """The next token of each row from its float32 logits (rows, vocab)."""
        import torch

        if self.greedy:
            return torch.argmax(logits, dim=-1)
        scores = self.warpers(None, logits) if self.warpers else logits
        probs = torch.softmax(scores, dim=-1)
        cdf = torch.cumsum(probs, dim=-1)
        total = cdf[:, -1:]
        u = torch.tensor(
            [r.random() if r is not None else 0.5 for r in rngs], dtype=cdf.dtype, device=cdf.device
        ).unsqueeze(1)
        # strictly below the total, so the first column above it exists and has mass
        x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
        idx = torch.searchsorted(cdf, x, right=True).squeeze(1)
        return idx.clamp_(max=logits.shape[-1] - 1)


def generate_refill(
    model: Any,
    requests: Sequence[Request],
    *,
    width: int,
    pad_id: int,
    eos_ids: set[int],
    sampler: Sampler,
    stopped: Callable[[list[int]], bool] | None = None,
    want_logprobs: bool = False,
    refill: int = 1,
    stats: DecodeStats | None = None,
    kept: PrefixCache | None = None,
    min_tokens: int = 0,
) -> None:
    """Decode every request to its end with at most `width` rows in flight; fills them in place.

    The caller holds eval + inference mode. `stopped(tokens)` says whether a row's completion now
    contains a stop string; a row ends at EOS (the EOS id is kept in `tokens`, as `model.generate`
    keeps it), at its stop string or at its budget. With `kept`, prompts start from the longest
    prefix they share with a row kept there, and every row that ends is kept. A row shorter than
    `min_tokens` cannot pick an EOS id; its log-probabilities still come from the raw logits.
    """
    import torch

    stats = stats if stats is not None else DecodeStats()
    device = _device(model)
    cache_name = cache_kwarg(model) or "cache"
    width = max(1, min(width, len(requests)))
    refill = max(1, min(refill, width))
    waiting = deque(
        sorted(range(len(requests)), key=lambda i: (-len(requests[i].prompt), requests[i].prompt))
    )
    batch: list[int] = []  # request index of each cache row
    cache: Any = None
    mask: Any = None  # (rows, cache length) 1 where the column is real
    last: Any = None  # (rows,) the sampled token not yet in the cache
    pos: Any = None  # (rows,) its position

    def take(rows: list[int], logits: Any) -> Any:
        """Sample one token per row, record it, and return the tokens and which rows ended."""
        scores = logits
        short = [j for j, i in enumerate(rows) if len(requests[i].tokens) < min_tokens]
        ends = sorted(t for t in eos_ids if 0 <= t < logits.shape[-1]) if short else []
        if ends:
            rows_t = torch.tensor(short, device=logits.device)[:, None]
            scores = logits.clone()
            scores[rows_t, torch.tensor(ends, device=logits.device)] = -math.inf
        toks = sampler.pick(scores, [requests[i].rng for i in rows])
        lps = None
        if want_logprobs:
            lps = torch.log_softmax(logits, dim=-1).gather(-1, toks[:, None]).squeeze(1).tolist()
        ended: list[bool] = []
        for j, (i, t) in enumerate(zip(rows, toks.tolist(), strict=True)):
            req = requests[i]
            req.tokens.append(t)
            if lps is not None:
                req.logprobs.append(lps[j])
            ended.append(
                t in eos_ids
                or len(req.tokens) >= req.budget
                or (stopped is not None and stopped(req.tokens))
            )
        return toks, ended

    while waiting or batch:
        # Join while slots are free (again, if a newcomer ended at its first token).
        while waiting and (free := width - len(batch)) > 0 and (not batch or free >= refill):
            new = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            pieces, logits = _prefill(
                model, [requests[i].prompt for i in new], pad_id, device, kept
            )
            stats.prefills += 1
            toks, ended = take(new, logits)
            new_pos = torch.tensor([len(requests[i].prompt) for i in new], device=device)
            if batch:  # the running rows first, the newcomers after them
                pieces = [(_kvs(cache), mask, [[j] for j in range(len(batch))])] + [
                    (kv, m, [[len(batch) + d for d in ds] for ds in dests])
                    for kv, m, dests in pieces
                ]
                last, pos = torch.cat([last, toks]), torch.cat([pos, new_pos])
            else:
                last, pos = toks, new_pos
            batch += new
            room = max(requests[i].budget - len(requests[i].tokens) for i in batch)
            cache, mask = slab_cache(model, pieces, room, len(batch))
            done = [False] * (len(batch) - len(new)) + ended
            _keep(kept, cache, mask, batch, done, requests)
            cache, mask, last, pos, batch = drop_rows(cache, mask, last, pos, batch, done)
        if not batch:
            continue  # the last prompts all ended at their first token
        mask = torch.cat([mask, mask.new_ones((len(batch), 1))], dim=1)
        out = model(
            input_ids=last[:, None],
            attention_mask=mask,
            position_ids=pos[:, None],
            use_cache=True,
            **{cache_name: cache},
        )
        logits = out.logits[:, -1].to(dtype=torch.float32)
        del out
        stats.decode_steps += 1
        stats.slots += width if waiting else len(batch)
        stats.capacity += width
        stats.tokens += len(batch)
        last, ended = take(batch, logits)
        pos = pos + 1
        _keep(kept, cache, mask, batch, ended, requests)
        cache, mask, last, pos, batch = drop_rows(cache, mask, last, pos, batch, ended)


def _keep(
    kept: PrefixCache | None,
    cache: Any,
    mask: Any,
    batch: list[int],
    done: Sequence[bool],
    requests: Sequence[Request],
) -> None:
    """Keep the rows that ended: their cache holds the prompt and every token but the last."""
    if kept is None or not any(done):
        return
    rows = [
        (j, requests[i].prompt + requests[i].tokens[:-1])
        for j, (i, d) in enumerate(zip(batch, done, strict=True))
        if d
    ]
    keep_ended(kept, cache.layers, mask, rows)


def _device(model: Any) -> Any:
    import torch

    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def _prefill(
    model: Any, prompts: list[list[int]], pad_id: int, device: Any, kept: PrefixCache | None = None
) -> tuple[list[tuple[list[tuple[Any, Any]], Any, list[list[int]]]], Any]:
    """The newcomers' prompts through the model: pieces (per-layer keys/values, mask, and for each
    of its rows the newcomers it is the cache of), and each newcomer's float32 logits.

    Identical prompts are computed once. A prompt that extends a row kept in `kept` (the same
    episode a turn later) computes only its new tokens, on a copy of that row's cache; prompts
    that share a long prefix among themselves (the k samples of one task) compute it once, then
    their own suffixes on a copy of its cache. Rows go through the model in buckets of similar
    length, so little of a forward is padding.
    """
    import torch

    unique: dict[tuple[int, ...], int] = {}
    row_of = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
    firsts = [list(p) for p in unique]
    parts: list[tuple[Any, Any, Any]] = []  # (cache, mask, logits) of `order`'s rows
    order: list[int] = []
    hits = (
        {}
        if kept is None or not kept.enabled
        else {i: hit for i, p in enumerate(firsts) if (hit := kept.match(p)) is not None}
    )
    if hits:
        rows_hit = list(hits)
        for rows in _buckets(rows_hit, [len(firsts[i]) - hits[i][1] for i in rows_hit]):
            cache, mask = cache_from_kept(model, [hits[i] for i in rows])
            cache, mask, logits = _forward(
                model,
                [firsts[i][hits[i][1] :] for i in rows],
                pad_id,
                device,
                cache=cache,
                past_mask=mask,
                starts=[hits[i][1] for i in rows],
            )
            parts.append((_kvs(cache), mask, logits))
            order += rows
    rest = [i for i in range(len(firsts)) if i not in hits]
    groups = [
        (n, [rest[j] for j in members]) for n, members in _share_groups([firsts[i] for i in rest])
    ]
    grouped = {i for _, members in groups for i in members}
    singles = [i for i in rest if i not in grouped]
    for rows in _buckets(singles, [len(firsts[i]) for i in singles]):
        cache, mask, logits = _forward(model, [firsts[i] for i in rows], pad_id, device)
        parts.append((_kvs(cache), mask, logits))
        order += rows
    if groups:
        heads = list(range(len(groups)))
        head_parts, head_order = [], []
        for rows in _buckets(heads, [n for n, _ in groups]):
            head_cache, head_mask, _ = _forward(
                model, [firsts[groups[g][1][0]][: groups[g][0]] for g in rows], pad_id, device
            )
            head_parts.append((_kvs(head_cache), head_mask))
            head_order += rows
        prefix_kvs, prefix_mask = _concat(head_parts)
        row_of_group = {g: j for j, g in enumerate(head_order)}
        members = [(i, g) for g, (_, m) in enumerate(groups) for i in m]
        tails = [len(firsts[i]) - groups[g][0] for i, g in members]
        for bucket in _buckets(list(range(len(members))), tails):
            rows = [members[j][0] for j in bucket]
            gs = [members[j][1] for j in bucket]
            cache, mask = _take(model, prefix_kvs, prefix_mask, [row_of_group[g] for g in gs])
            cache, mask, logits = _forward(
                model,
                [firsts[i][groups[g][0] :] for i, g in zip(rows, gs, strict=True)],
                pad_id,
                device,
                cache=cache,
                past_mask=mask,
                starts=[groups[g][0] for g in gs],
            )
            parts.append((_kvs(cache), mask, logits))
            order += rows
    # Duplicates are not copied here: the decode cache is written from the pieces directly.
    dests: list[list[int]] = [[] for _ in order]
    where = {u: j for j, u in enumerate(order)}
    for newcomer, u in enumerate(row_of):
        dests[where[u]].append(newcomer)
    logits = torch.cat([lg for _, _, lg in parts])
    logits = logits[torch.tensor([where[u] for u in row_of], device=logits.device)]
    pieces, at = [], 0
    for kv, m, _ in parts:
        pieces.append((kv, m, dests[at : at + m.shape[0]]))
        at += m.shape[0]
    return pieces, logits


# A common prefix shorter than this is computed per row: a second forward would cost more.
MIN_SHARED_PREFIX = 32
# A prefill bucket pads at most this share of its slots, or this many tokens.
MAX_PAD_SHARE = 0.125
MAX_PAD_TOKENS = 64


def _share_groups(prompts: list[list[int]]) -> list[tuple[int, list[int]]]:
    """(prefix length, member rows) for rows worth computing a common prefix for once.

    Rows are taken in sorted order; a row joins the group before it while that lowers the tokens
    to compute: with n members sharing p tokens, a row sharing p' of them saves p' and costs the
    members n * (p - p'). Every member keeps at least one token of its own (its logits).
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups: list[tuple[int, list[int]]] = []
    members: list[int] = []
    shared = 0
    for i in order:
        if members:
            common = min(
                shared, common_prefix(prompts[members[-1]], prompts[i]), len(prompts[i]) - 1
            )
            if common >= MIN_SHARED_PREFIX and len(members) * (shared - common) < common:
                members.append(i)
                shared = common
                continue
            if len(members) > 1:
                groups.append((shared, members))
        members, shared = [i], len(prompts[i]) - 1
    if len(members) > 1:
        groups.append((shared, members))
    return groups


def _buckets(items: list[int], lengths: list[int]) -> list[list[int]]:
    """`items` split, longest first, into runs whose left-padding stays small."""
    ranked = sorted(range(len(items)), key=lambda j: -lengths[j])
    out: list[list[int]] = []
    run: list[int] = []
    wide = real = 0
    for j in ranked:
        if run:
            pad = wide * (len(run) + 1) - (real + lengths[j])
            if pad <= max(MAX_PAD_SHARE * wide * (len(run) + 1), MAX_PAD_TOKENS):
                run.append(items[j])
                real += lengths[j]
                continue
            out.append(run)
        run, wide, real = [items[j]], lengths[j], lengths[j]
    if run:
        out.append(run)
    return out


def _forward(
    model: Any,
    rows: list[list[int]],
    pad_id: int,
    device: Any,
    *,
    cache: Any = None,
    past_mask: Any = None,
    starts: list[int] | None = None,
) -> tuple[Any, Any, Any]:
    """One prefill forward over left-padded `rows`, after `cache` (whose rows start at `starts`)."""
    import torch
    from transformers import DynamicCache

    wide = max(len(r) for r in rows)
    ids = torch.full((len(rows), wide), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), wide), dtype=torch.long)
    for j, r in enumerate(rows):
        ids[j, wide - len(r) :] = torch.tensor(r, dtype=torch.long)
        mask[j, wide - len(r) :] = 1
    ids, mask = ids.to(device), mask.to(device)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)  # as model.generate derives them
    if starts is not None:
        positions = positions + torch.tensor(starts, device=device)[:, None] * mask
    if past_mask is not None:
        mask = torch.cat([past_mask, mask], dim=1)
    cache = cache if cache is not None else DynamicCache(config=model.config)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
        **{cache_kwarg(model) or "cache": cache},
    )
    logits = out.logits[:, -1].to(dtype=torch.float32)
    del out
    return cache, mask, logits


def _left_pad(x: Any, length: int) -> Any:
    """`x` (rows, heads, seq, dim) or (rows, seq) left-padded with zeros to `length` along seq."""
    import torch

    seq_dim = -2 if x.dim() == 4 else -1
    short = length - x.shape[seq_dim]
    if short == 0:
        return x
    shape = list(x.shape)
    shape[seq_dim] = short
    return torch.cat([x.new_zeros(shape), x], dim=seq_dim)


def _kvs(cache: Any) -> list[tuple[Any, Any]]:
    """Each layer's (keys, values) of a cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def _concat(
    parts: Sequence[tuple[list[tuple[Any, Any]], Any]],
) -> tuple[list[tuple[Any, Any]], Any]:
    """The rows of several (keys/values, mask) pairs as one, left-padded to the longest."""
    import torch

    if len(parts) == 1:
        return parts[0]
    length = max(m.shape[-1] for _, m in parts)
    kvs = [
        (
            torch.cat([_left_pad(kv[j][0], length) for kv, _ in parts]),
            torch.cat([_left_pad(kv[j][1], length) for kv, _ in parts]),
        )
        for j in range(len(parts[0][0]))
    ]
    return kvs, torch.cat([_left_pad(m, length) for _, m in parts])


def _take(model: Any, kvs: list[tuple[Any, Any]], mask: Any, rows: list[int]) -> tuple[Any, Any]:
    """A new cache holding copies of `rows`, unused leading columns trimmed."""
    import torch
    from transformers import DynamicCache

    idx = torch.tensor(rows, device=mask.device)
    mask = mask[idx]
    first = first_used(mask)
    out = DynamicCache(config=model.config)
    for layer, (k, v) in zip(out.layers, kvs, strict=True):
        layer.update(k[idx][..., first:, :], v[idx][..., first:, :])
    return out, mask[:, first:]
