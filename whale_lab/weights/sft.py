"""From accepted episodes to one SFT pass: examples, masking, token-mean NLL, AdamW steps.

Every turn of an accepted trace becomes one example: the messages the model saw that turn, put
through the chat template with the generation prompt, form the masked prefix; the model's own
response (plus the end token when it stopped by itself) is the target. Only target tokens carry
loss, so the model never learns to produce system, user, tool or feedback text.

The target is the token ids the backend sampled (`TurnRecord.token_ids`): text -> ids is not the
inverse of ids -> text on real tokenizers, so re-encoding the response would train on sequences
the model never produced. Only a turn recorded without ids (a backend that returns none, or a
trace written before ids were kept) is re-encoded from its text; `SftStats.reencoded_turns`
counts those.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from whale_lab.trace import EpisodeTrace, TurnRecord

IGNORE_INDEX = -100
Encode = Callable[[Sequence[dict[str, str]]], Sequence[int]]
Reduce = Callable[[float], float]  # sums a number over the training processes


@dataclass(frozen=True)
class SftExample:
    """One training sequence; `labels` is -100 wherever no loss is taken."""

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    task_id: str = ""
    reencoded: bool = False  # the target came from re-encoding the response text, not sampled ids
    trajectory: int = 0  # which accepted trace the turn belongs to (minibatches of trajectories)

    @property
    def n_target(self) -> int:
        return sum(1 for x in self.labels if x != IGNORE_INDEX)

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass(frozen=True)
class SftStats:
    """What one SFT pass did; `loss` is the token-mean NLL over every target token of the pass."""

    loss: float | None
    tokens: int  # target tokens trained on
    input_tokens: int  # every (unpadded) token that went through the model
    grad_norm: float | None  # mean pre-clip norm over the optimizer steps
    examples: int
    minibatches: int
    skipped_nonfinite: int
    seconds: float
    reencoded_turns: int = 0  # examples whose target was re-encoded from text (no sampled ids)


def accept(traces: Sequence[EpisodeTrace], threshold: float) -> list[EpisodeTrace]:
    """The rejection-sampling rule: keep a rollout only if its reward is strictly above threshold."""
    return [t for t in traces if t.reward > threshold]


def end_token_id(tokenizer: Any, model: Any = None) -> int:
    """The token a generation stops on: the tokenizer's EOS, else the model's generation config."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None and model is not None:
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
    if eos is None:
        raise ValueError("the tokenizer has no end-of-sequence token: cannot mark where turns stop")
    return int(eos)


def render_prefix(
    tokenizer: Any,
    messages: Sequence[dict[str, str]],
    template_kwargs: dict[str, Any] | None = None,
) -> list[int]:
    """The prompt exactly as a chat backend feeds it: chat template plus generation prompt, with
    the same template variables (`sampling.chat_template_kwargs`, e.g. enable_thinking)."""
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages],
        add_generation_prompt=True,
        tokenize=False,
        **(template_kwargs or {}),
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def turn_example(
    turn: TurnRecord,
    tokenizer: Any,
    eos_id: int,
    *,
    max_length: int | None = None,
    task_id: str = "",
    encode: Encode | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> SftExample | None:
    """One example from one turn, or None when the turn has nothing to learn (error, empty).

    `encode` renders the prompt exactly as the serving backend does (default: `render_prefix`).
    The target is the sampled ids, plus the end token when the generation stopped.
    """
    if turn.finish_reason == "error":
        return None
    prefix = (
        list(encode(turn.prompt))
        if encode is not None
        else render_prefix(tokenizer, turn.prompt, template_kwargs)
    )
    reencoded = turn.token_ids is None
    if reencoded:
        target = list(tokenizer(turn.response, add_special_tokens=False)["input_ids"])
    else:
        target = [int(t) for t in turn.token_ids or ()]
    # a backend that kept the end token in its ids has already put it there
    if turn.finish_reason == "stop" and (reencoded or not target or target[-1] != eos_id):
        target.append(eos_id)
    if not target:
        return None
    if max_length is not None and len(prefix) + len(target) > max_length:
        if len(target) >= max_length:
            return None  # a response longer than the model's window: nothing sensible to keep
        prefix = prefix[len(prefix) + len(target) - max_length :]  # keep the recent context
    ids = tuple(prefix + target)
    labels = tuple([IGNORE_INDEX] * len(prefix) + target)
    return SftExample(ids, labels, task_id, reencoded)


def build_examples(
    traces: Sequence[EpisodeTrace],
    tokenizer: Any,
    *,
    eos_id: int | None = None,
    max_length: int | None = None,
    encode: Encode | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> list[SftExample]:
    """Every turn of every given (already accepted) trace, as examples."""
    eos = end_token_id(tokenizer) if eos_id is None else eos_id
    out: list[SftExample] = []
    for n, trace in enumerate(traces):
        for turn in trace.turns:
            ex = turn_example(
                turn,
                tokenizer,
                eos,
                max_length=max_length,
                task_id=trace.task_id,
                encode=encode,
                template_kwargs=template_kwargs,
            )
            if ex is not None:
                out.append(dataclasses.replace(ex, trajectory=n) if n else ex)
    return out


def enable_checkpointing(tm: Any) -> None:
    """Recompute activations in the backward pass (`rsft.gradient_checkpointing`). Non-reentrant
    checkpointing keeps gradients flowing to LoRA weights behind frozen embeddings; generation
    (eval mode) is unaffected."""
    base = tm.base
    kwargs = {"use_reentrant": False}
    enable = getattr(base, "activation_checkpointing_enable", None)  # transformers >= 5.x's name
    if callable(enable):
        enable(activation_checkpointing_kwargs=kwargs)
        return
    enable = getattr(base, "gradient_checkpointing_enable", None)
    if not callable(enable):
        from whale_lab.weights.lora import WeightsError

        raise WeightsError(
            f"rsft.gradient_checkpointing: {type(base).__name__} does not support it"
        )
    enable(gradient_checkpointing_kwargs=kwargs)


def collate(examples: Sequence[SftExample], pad_id: int, device: Any = "cpu") -> dict[str, Any]:
    """Right-padded tensors: input_ids, attention_mask, labels (-100 on padding)."""
    import torch

    width = max(len(e) for e in examples)
    n = len(examples)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    labels = torch.full((n, width), IGNORE_INDEX, dtype=torch.long)
    for i, e in enumerate(examples):
        L = len(e)
        ids[i, :L] = torch.tensor(e.input_ids, dtype=torch.long)
        mask[i, :L] = 1
        labels[i, :L] = torch.tensor(e.labels, dtype=torch.long)
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
    }


def _no_sync(model: Any) -> Any:
    """Gradients kept local for all but a minibatch's last chunk (DDP); a plain model has none."""
    no_sync = getattr(model, "no_sync", None)
    return no_sync() if callable(no_sync) else contextlib.nullcontext()


def _chunks(batch: list[SftExample], max_tokens: int) -> list[list[SftExample]]:
    """Split a minibatch into forward passes of at most ~max_tokens padded tokens (memory only)."""
    out: list[list[SftExample]] = []
    cur: list[SftExample] = []
    width = 0
    for e in sorted(batch, key=len):
        w = max(width, len(e))
        if cur and w * (len(cur) + 1) > max_tokens:
            out.append(cur)
            cur, w = [], len(e)
        cur.append(e)
        width = w
    if cur:
        out.append(cur)
    return out


def minibatches(
    examples: Sequence[SftExample], size: int, unit: str, seed: int
) -> list[list[SftExample]]:
    """The pass's minibatches in shuffled order: `size` examples each ("examples"), or every
    turn of `size` accepted trajectories each ("trajectories", as the paper counts them)."""
    if unit == "examples":
        order = list(examples)
        random.Random(seed).shuffle(order)
        return [order[i : i + size] for i in range(0, len(order), size)]
    if unit != "trajectories":
        raise ValueError(f"unknown minibatch unit {unit!r}")
    by_traj: dict[int, list[SftExample]] = {}
    for e in examples:
        by_traj.setdefault(e.trajectory, []).append(e)
    keys = sorted(by_traj)
    random.Random(seed).shuffle(keys)
    return [[e for k in keys[i : i + size] for e in by_traj[k]] for i in range(0, len(keys), size)]


def sum_nll(model: Any, batch: dict[str, Any]) -> tuple[Any, int]:
    """Summed NLL over target tokens and their count; logits are upcast only where they count."""
    import torch
    import torch.nn.functional as F

    out = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    )
    labels = batch["labels"]
    # Shift the labels, not the logits: slicing the logits would cost a full-size copy in backward.
    shifted = torch.full_like(labels, IGNORE_INDEX)
    shifted[:, :-1] = labels[:, 1:]
    keep = shifted != IGNORE_INDEX
    n = int(keep.sum().item())
    if n == 0:
        return torch.zeros((), device=out.logits.device, requires_grad=True), 0
    sel = out.logits[keep].float()
    return F.cross_entropy(sel, shifted[keep], reduction="sum"), n


def sft_pass(
    model: Any,
    optimizer: Any,
    examples: Sequence[SftExample],
    *,
    minibatch_size: int,
    max_grad_norm: float,
    pad_id: int,
    params: Sequence[Any] | None = None,
    seed: int = 0,
    max_tokens_per_forward: int = 16384,
    device: Any = None,
    should_stop: Callable[[], bool] | None = None,
    minibatch_unit: str = "examples",
    rank: int = 0,
    world: int = 1,
    reduce: Reduce | None = None,
    clip: Callable[[Sequence[Any], float], Any] | None = None,
) -> SftStats:
    """One pass over `examples` in shuffled minibatches; one AdamW step per minibatch.

    The loss of a minibatch is the mean NLL over its target tokens (token-mean, not
    sequence-mean), so long responses weigh by their length. A minibatch too large for one
    forward is split into chunks whose gradients add up to exactly the same token mean.

    Data parallel (`world` > 1, `model` wrapped by DDP or FSDP): every process builds the same
    minibatches, takes its share of each (`rank::world`) and scales its loss by `world`, so the
    gradient the wrapper averages is the single-process token mean of the whole minibatch;
    `reduce` sums the reported numbers over the processes and `clip` clips the synced gradients.
    """
    import torch

    t0 = time.perf_counter()
    if not examples:
        return SftStats(None, 0, 0, None, 0, 0, 0, 0.0)
    reencoded = sum(1 for e in examples if e.reencoded)
    if params is None:
        params = [p for p in model.parameters() if p.requires_grad]
    if device is None:
        device = next(iter(params)).device if params else "cpu"
    batches = minibatches(examples, minibatch_size, minibatch_unit, seed)
    total = reduce or (lambda x: x)
    clip_norm = clip or torch.nn.utils.clip_grad_norm_
    was_training = model.training
    model.train()
    total_nll = 0.0
    total_tokens = 0
    input_tokens = 0
    norms: list[float] = []
    skipped = 0
    steps = 0
    try:
        for mb in batches:
            if should_stop is not None and should_stop():
                break
            n_target = sum(e.n_target for e in mb)
            if n_target == 0:
                continue
            optimizer.zero_grad(set_to_none=True)
            mb_nll = 0.0
            local = mb[rank::world] if world > 1 else mb
            chunks = _chunks(local, max_tokens_per_forward)
            for i, chunk in enumerate(chunks):
                last = i == len(chunks) - 1
                with contextlib.nullcontext() if last else _no_sync(model):
                    batch = collate(chunk, pad_id, device)
                    nll, _n = sum_nll(model, batch)
                    (nll / n_target if world == 1 else nll * world / n_target).backward()
                mb_nll += float(nll.detach())
                input_tokens += sum(len(e) for e in chunk)
            if not chunks:  # more processes than examples: join the gradient sync with zeros
                batch = collate(mb[:1], pad_id, device)
                model(input_ids=batch["input_ids"], use_cache=False).logits.sum().mul(0).backward()
            mb_nll = total(mb_nll)
            norm = float(clip_norm(params, max_grad_norm))
            steps += 1
            if not math.isfinite(norm) or not math.isfinite(mb_nll):
                optimizer.zero_grad(set_to_none=True)
                skipped += 1
                continue
            optimizer.step()
            norms.append(norm)
            total_nll += mb_nll
            total_tokens += n_target
    finally:
        optimizer.zero_grad(set_to_none=True)
        model.train(was_training)
    loss = total_nll / total_tokens if total_tokens else None
    grad = sum(norms) / len(norms) if norms else None
    return SftStats(
        loss=loss,
        tokens=total_tokens,
        input_tokens=int(total(float(input_tokens))),
        grad_norm=grad,
        examples=len(examples),
        minibatches=steps,
        skipped_nonfinite=skipped,
        seconds=time.perf_counter() - t0,
        reencoded_turns=reencoded,
    )
