"""Verified weight sync: after every publish, the backend must generate with the weights just trained.

A publish can succeed and change nothing: a server answers `load_lora_adapter` with 200 and keeps
generating with the base model (vLLM loading a LoRA adapter that activates no module), or a backend
holds a copy of the model rather than the trained one. The run would finish with unchanged scores
and no word. So after each publish the backend continues a few fixed probe prompts greedily with
log-probabilities (never ending before `PROBE_TOKENS`: a model trained on short replies may end
every probe at once and leave nothing to compare), and the trainer scores the very same token ids
under its new weights and under the previous ones (a copy kept before the update). The served
log-probabilities must match the new weights within `SYNC_TOLERANCE` and be clearly closer to them
than to the previous ones; otherwise `WeightSyncError` stops the run with one line.

What "clearly" means is measured, not assumed: the served-vs-new distance is the numerical noise
of this backend (about 1e-6 for the hf backend in float32, up to about 1e-2 for a bf16 server
against a float32 trainer), and the previous weights must sit `RESOLVE_RATIO` times farther away
(and above `RESOLVE_FLOOR`). A change too small to resolve that way, or a backend that returns no
log-probabilities, is `unverified`, never `verified`. The same rule in the other direction stops a
run whose backend clearly serves the previous weights even when the update was small; without
log-probabilities, greedy tokens that follow the previous weights and not the new ones do too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from whale_lab.backends.base import Generation, Message, SamplingParams, eos_token_ids
from whale_lab.weights.lora import TrainableModel, WeightsError

VERIFIED, UNVERIFIED, SKIPPED = "verified", "unverified", "skipped"

# Short chat prompts with no special format, so every chat template renders them.
PROBE_PROMPTS: tuple[tuple[Message, ...], ...] = (
    ({"role": "user", "content": "What is 12 + 30?"},),
    ({"role": "user", "content": "Name three colours."},),
    ({"role": "user", "content": "Write one sentence about whales."},),
)
PROBE_TOKENS = 8
# Mean |served - trainer| log-probability per probe token (nats) still read as "the same weights".
# The same float32 weights on CPU agree to ~1e-6 (KV-cached generation against one full forward);
# a bf16 GPU server against a float32 trainer stays around 1e-2. Module constants, not settings.
SYNC_TOLERANCE = 0.05
# The weights on one side must be this many times farther from the served numbers than the other
# side's (the measured noise) before the check takes a side...
RESOLVE_RATIO = 10.0
# ...and farther than float32 round-off over a forward pass: below this nothing is resolvable.
RESOLVE_FLOOR = 1e-4

Encode = Callable[[Sequence[Message]], Sequence[int]]


class WeightSyncError(WeightsError):
    """The backend does not generate with the weights just published (one line: what and why)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))  # a server's error text may span lines


@dataclass(frozen=True)
class SyncResult:
    """What one check measured; distances are mean |difference| of log-probabilities per token."""

    status: str  # verified | unverified | mismatch
    served_version: str
    fingerprint: str = ""  # short hash of the trained tensors that were published
    distance: float | None = None  # served vs the new weights
    previous_distance: float | None = None  # served vs the previous weights
    separation: float | None = None  # new vs previous weights: what the check can resolve
    tokens: int = 0  # probe tokens compared
    note: str = ""  # why unverified / what mismatched
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SyncResult:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class _Probe:
    """One probe continuation as served, and as the trainer scores it."""

    prompt: list[int]  # the trainer's rendering of the prompt
    ids: list[int]  # the served token ids (or the text re-encoded: `exact` False)
    served: list[float]  # served log-probabilities, [] when the backend gave none
    exact: bool
    served_prompt_tokens: int


def mean_abs(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True)) / len(a) if a else 0.0


def judge(
    served: Sequence[float],
    new: Sequence[float],
    previous: Sequence[float] | None,
    new_gap: Sequence[float],
    previous_gap: Sequence[float] | None,
    *,
    exact_ids: bool,
    tolerance: float = SYNC_TOLERANCE,
) -> tuple[str, dict[str, float | None], str]:
    """(status, distances, note or cause) from per-token numbers pooled over the probes.

    `served` is empty when the backend returns no log-probabilities; `previous` is None when there
    are no previous weights to compare with. `*_gap` is how far each served token is from the
    argmax under those weights (0 for a greedy token). Status is verified, unverified or mismatch
    (cause "stale": the served numbers are the previous weights'; "neither"); a mismatch on ids
    re-encoded from text (`exact_ids` False) is only called when the served tokens fit the
    previous weights, since a re-tokenisation fits neither.
    """
    dist: dict[str, float | None] = {"distance": None, "previous": None, "separation": None}
    if previous is not None:
        dist["separation"] = mean_abs(new, previous)
    if not new:
        return (
            UNVERIFIED,
            dist,
            "the probe generations were empty (the backend ended every probe at its first "
            "token: it ignores a minimum reply length)",
        )
    if not served:
        stale = (
            previous_gap is not None and max(new_gap) > tolerance and max(previous_gap) <= tolerance
        )
        if stale:
            assert previous_gap is not None
            return (
                "mismatch",
                dist,
                f"the greedy tokens follow the previous weights (greedy gap {max(new_gap):.3f} "
                f"nats under the new weights, {max(previous_gap):.3f} under the previous)",
            )
        return UNVERIFIED, dist, "the backend returns no logprobs"
    d_new = mean_abs(served, new)
    d_old = mean_abs(served, previous) if previous is not None else None
    dist["distance"], dist["previous"] = d_new, d_old

    def clearly(far: float, near: float) -> bool:
        return far > max(RESOLVE_RATIO * near, RESOLVE_FLOOR)

    if d_old is not None and d_new <= tolerance and clearly(d_old, d_new):
        return VERIFIED, dist, ""
    if d_old is not None and d_old <= tolerance and (d_new > tolerance or clearly(d_new, d_old)):
        return "mismatch", dist, "stale"
    if d_new > tolerance:
        if not exact_ids:
            return (
                UNVERIFIED,
                dist,
                "the backend returns no token ids and its text re-encodes differently",
            )
        return "mismatch", dist, "neither"
    if d_old is None:
        return UNVERIFIED, dist, "no previous weights to compare with"
    return (
        UNVERIFIED,
        dist,
        f"the update moved the probe log-probabilities by {dist['separation'] or 0.0:.2g} "
        f"nats/token, too little to resolve against this backend's numerical noise "
        f"({d_new:.2g}): the served weights could be either",
    )


class WeightSync:
    """The trainer's side of the check: probe prompts, the previous weights, the scoring pass."""

    def __init__(
        self,
        tm: TrainableModel,
        *,
        encode: Encode | None = None,
        prompts: Sequence[Sequence[Message]] = PROBE_PROMPTS,
        max_new_tokens: int = PROBE_TOKENS,
        tolerance: float = SYNC_TOLERANCE,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tm = tm
        self.encode = encode
        self.template_kwargs = dict(template_kwargs or {})
        self.prompts = [list(p) for p in prompts]
        self.tolerance = tolerance
        self.params = SamplingParams(
            temperature=0.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            seed=0,
            logprobs=True,
        )
        self._previous: dict[str, Any] | None = None

    # ------------------------------------------------------------------ the previous weights
    def remember(self) -> None:
        """Keep the trainable tensors as they are now (what the backend serves until the next
        publish); called before an update. A CPU copy: LoRA tensors are small, and full weights
        must not double the accelerator's memory."""
        self._previous = {n: p.detach().to("cpu", copy=True) for n, p in self.tm.named_trainable()}

    @contextlib.contextmanager
    def _weights(self, which: str) -> Iterator[bool]:
        """The model as it was before the update ("previous") or without the adapter ("base");
        yields False when there is nothing to compare with. The live tensors come back exactly."""
        import torch

        if which == "base":
            disable = getattr(self.tm.model, "disable_adapter", None) if self.tm.lora else None
            if disable is None:
                yield False
                return
            with disable():
                yield True
            return
        previous = self._previous
        if previous is None:
            yield False
            return
        live = dict(self.tm.named_trainable())
        held = {n: p.detach().to("cpu", copy=True) for n, p in live.items()}
        try:
            with torch.no_grad():
                for n, p in live.items():
                    p.copy_(previous[n])
            yield True
        finally:
            with torch.no_grad():
                for n, p in live.items():
                    p.copy_(held[n])

    def fingerprint(self) -> str:
        """12 hex digits over the trainable tensors' bytes: which weights were published."""
        import torch

        h = hashlib.blake2b(digest_size=6)
        for name, p in self.tm.named_trainable():
            h.update(name.encode())
            flat = p.detach().reshape(-1).contiguous().cpu()
            h.update(memoryview(flat.view(torch.uint8).numpy()))
        return h.hexdigest()

    # ------------------------------------------------------------------ the check
    def check(
        self,
        backend: Any,
        *,
        served_version: str,
        adapter: str = "",
        baseline: bool = False,
        label: str = "",
    ) -> SyncResult:
        """Probe `backend` and compare; a mismatch raises `WeightSyncError`.

        `baseline`: compare with the weights before any adapter (a first publish of a resumed or
        given adapter), rather than with the copy kept by `remember`. A backend over several
        endpoints (`.endpoints`) has each endpoint probed on its own: the result is verified only
        when every endpoint is, and a mismatch names the endpoint.
        """
        endpoints = list(getattr(backend, "endpoints", None) or [])
        if len(endpoints) < 2:
            return self._check_one(
                backend,
                served_version=served_version,
                adapter=adapter,
                baseline=baseline,
                label=label,
            )
        previous = self._previous
        results = []
        try:
            for e in endpoints:
                self._previous = previous  # each endpoint compared with the same two weights
                where = f" at {getattr(e, 'base_url', '?')}"
                what = (label or (f"adapter {adapter!r}" if adapter else served_version)) + where
                results.append(
                    self._check_one(
                        e,
                        served_version=served_version,
                        adapter=adapter,
                        baseline=baseline,
                        label=what,
                    )
                )
        finally:
            self._previous = None
        return _combine(results)

    def _check_one(
        self,
        backend: Any,
        *,
        served_version: str,
        adapter: str = "",
        baseline: bool = False,
        label: str = "",
    ) -> SyncResult:
        t0 = time.perf_counter()
        name = str(getattr(backend, "name", type(backend).__name__))
        what = label or (
            f"adapter {adapter!r}"
            if adapter
            else f"the weights trained in place ({served_version})"
        )
        try:
            gens = backend.generate(self.prompts, self.params)
            probes = [
                self._probe(p, g, name, what) for p, g in zip(self.prompts, gens, strict=True)
            ]
            probes = [p for p in probes if p.ids]
            fingerprint = self.fingerprint()
            new = self._score(probes)
            with self._weights("base" if baseline else "previous") as have_previous:
                previous = self._score(probes) if have_previous else None
        finally:
            self._previous = None  # one publish, one comparison: the next update keeps its own
        served = [x for p in probes for x in p.served]
        aligned = all(len(p.served) == len(p.ids) for p in probes)
        if served and not aligned:
            note = "the served log-probabilities do not line up with the token ids"
            status, dist = UNVERIFIED, {"distance": None, "previous": None, "separation": None}
        else:
            status, dist, note = judge(
                served,
                [x for lp, _ in new for x in lp],
                None if previous is None else [x for lp, _ in previous for x in lp],
                [x for _, gap in new for x in gap],
                None if previous is None else [x for _, gap in previous for x in gap],
                exact_ids=all(p.exact for p in probes),
                tolerance=self.tolerance,
            )
        result = SyncResult(
            status=status,
            served_version=served_version,
            fingerprint=fingerprint,
            distance=_round(dist["distance"]),
            previous_distance=_round(dist["previous"]),
            separation=_round(dist["separation"]),
            tokens=sum(len(p.ids) for p in probes),
            note=note,
            seconds=round(time.perf_counter() - t0, 6),
        )
        if status == "mismatch":
            raise WeightSyncError(self._message(name, what, adapter, result, probes))
        return result

    def _probe(self, prompt: list[Message], gen: Generation, backend: str, what: str) -> _Probe:
        if gen.finish_reason == "error":
            raise WeightSyncError(
                f"weight sync check failed on the {backend} backend for {what}: the probe "
                f"generation failed: {gen.error or 'no reason given'}"
            )
        tok = self.tm.tokenizer
        if self.encode is not None:
            ids = list(self.encode(prompt))
        else:
            text = tok.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=False, **self.template_kwargs
            )
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
        exact = bool(gen.token_ids) or gen.completion_tokens == 0
        out = (
            [int(t) for t in gen.token_ids]
            if exact
            else list(tok(gen.text, add_special_tokens=False)["input_ids"])
        )
        return _Probe(ids, out, [float(x) for x in gen.token_logprobs], exact, gen.prompt_tokens)

    def _score(self, probes: Sequence[_Probe]) -> list[tuple[list[float], list[float]]]:
        """Per probe: each token's log-probability under the model as it is now, and its gap to
        the most likely token there that the probe could pick (no end token before the probe's
        minimum length). One right-padded forward pass over all probes."""
        if not probes:
            return []
        import torch

        model = self.tm.model
        seqs = [p.prompt + p.ids for p in probes]
        width = max(len(s) for s in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
        device = self.tm.device
        ends = eos_token_ids(model, self.tm.tokenizer)
        was_training = bool(model.training)
        model.eval()
        try:
            with torch.inference_mode():
                logits = model(
                    input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False
                ).logits
                out = []
                for i, p in enumerate(probes):
                    start = len(p.prompt) - 1  # the logits at position t predict token t + 1
                    lp = torch.log_softmax(logits[i, start : start + len(p.ids)].float(), dim=-1)
                    chosen = lp.gather(-1, torch.tensor(p.ids, device=lp.device)[:, None])[:, 0]
                    pickable = lp.clone()
                    barred = [t for t in ends if 0 <= t < lp.shape[-1]]
                    if barred:
                        pickable[: self.params.min_new_tokens, barred] = -math.inf
                    gap = pickable.max(dim=-1).values - chosen
                    out.append((chosen.cpu().tolist(), gap.cpu().tolist()))
        finally:
            model.train(was_training)
        return out

    def _message(
        self, backend: str, what: str, adapter: str, r: SyncResult, probes: Sequence[_Probe]
    ) -> str:
        """One line: the backend, the adapter, the distances and the likely cause."""
        if r.note == "stale":
            cause = (
                "the server loaded the adapter but still generates with the previous weights "
                "(the base model on a first publish): check that it applies LoRA adapters to "
                "this model"
                if adapter
                else "the backend generates with a copy of the previous weights, not the model "
                "being trained"
            )
        elif r.note == "neither":
            cause = (
                "the served model is neither the trained one nor the previous one: a different "
                "base model, chat template or dtype on the server, or an adapter applied only in part"
            )
        else:
            cause = r.note
            if adapter:
                cause += ": the server loaded the adapter but does not generate with it"
        lengths = [(p.served_prompt_tokens, len(p.prompt)) for p in probes]
        odd = [(s, t) for s, t in lengths if s and s != t]
        if odd:
            cause += (
                f" (the backend counts {odd[0][0]} prompt tokens where the trainer counts "
                f"{odd[0][1]}: a different chat template?)"
            )
        if r.distance is not None:
            measured = (
                f"served log-probabilities are {r.distance:.3f} nats/token from the new weights"
                + (
                    f" and {r.previous_distance:.3f} from the previous ones"
                    if r.previous_distance is not None
                    else ""
                )
                + f" (tolerance {self.tolerance:g}, {r.tokens} probe tokens)"
            )
        else:
            measured = f"{r.tokens} probe tokens compared, no served log-probabilities"
        return f"weight sync failed on the {backend} backend for {what}: {measured}: {cause}"


def _combine(results: Sequence[SyncResult]) -> SyncResult:
    """One result for several endpoints: verified only when all are; the worst distance."""
    statuses = [r.status for r in results]
    status = VERIFIED if all(s == VERIFIED for s in statuses) else UNVERIFIED
    notes = [f"endpoint {i + 1}: {r.note}" for i, r in enumerate(results) if r.note]
    dists = [r.distance for r in results if r.distance is not None]
    first = results[0]
    return dataclasses.replace(
        first,
        status=status,
        distance=max(dists) if dists else None,
        previous_distance=min(
            (r.previous_distance for r in results if r.previous_distance is not None),
            default=None,
        ),
        tokens=sum(r.tokens for r in results),
        note="; ".join(notes),
        seconds=round(sum(r.seconds for r in results), 6),
    )


def _round(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)
