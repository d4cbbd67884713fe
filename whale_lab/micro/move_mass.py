"""How much probability a model puts on the legal moves it is shown: a chess diagnostic without sampling.

A chess harness lists every legal move; a model that has learnt to answer from the list puts most of
its probability, right after the opening move tag, on the listed moves, whatever it then picks among
them. `listed_move_mass` measures that on the first turn of each task, under a harness's own prompt,
by scoring every legal move as the continuation (any tokenisation: a move may be one token or
several). It separates "cannot copy a move from the list" (low mass: no harness layout can help,
and RSFT sees almost no legal moves to learn from) from "copies, but picks badly" (high mass, low
solution share: the levers have something to work on).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.domains.base import Domain, Task


@dataclass(frozen=True)
class MoveMass:
    tasks: int
    listed: float  # mean probability of some legal move
    solution: float  # mean probability of the puzzle's move
    legal_moves: float  # mean number of legal moves shown

    def summary(self) -> str:
        return (
            f"listed-move mass {self.listed:.3f}, solution {self.solution:.3f} "
            f"({self.tasks} positions, {self.legal_moves:.0f} legal moves on average)"
        )


def _runtime(harness: str | Path) -> Any:
    """The harness loaded in this process, as the pre-training transcripts load their styles."""
    from whale_lab.micro.styles import Style
    from whale_lab.micro.transcripts import load_runtime

    path = Path(harness)
    return load_runtime(Style("chess", str(path), path.read_text(encoding="utf-8")))


def _continuation_logprobs(
    model: Any, prefix: list[int], continuations: Sequence[list[int]]
) -> list[float]:
    """log P(continuation | prefix) for each continuation, in one padded forward pass."""
    import torch

    width = len(prefix) + max(len(c) for c in continuations)
    ids = torch.zeros((len(continuations), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for j, c in enumerate(continuations):
        row = prefix + c
        ids[j, : len(row)] = torch.tensor(row)
        mask[j, : len(row)] = 1
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    out = []
    for j, c in enumerate(continuations):
        start = len(prefix)
        total = sum(float(logp[j, start + i - 1, tok]) for i, tok in enumerate(c))
        out.append(total)
    return out


def listed_move_mass(
    model: Any,
    tokenizer: Any,
    domain: Domain,
    tasks: Sequence[Task],
    harness: str | Path,
    *,
    opening: str = "<move>",
) -> MoveMass:
    """Mean probability, over `tasks`, that the model's move after `opening` is a listed legal move."""
    runtime = _runtime(harness)
    max_turns = int(runtime.info()["max_turns"])
    listed_sum = solution_sum = moves_sum = 0.0
    n = 0
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        for task in tasks:
            env: Any = domain.make_env(task)
            history = [{"type": "observation", "observation": env.initial_observation()}]
            ctx = dict(env.context())
            ctx.setdefault("turn_count", 1)
            ctx["max_turns"] = max_turns
            messages = runtime.render(dict(task.fields), history, ctx)
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
            prefix = list(tokenizer(text + opening, add_special_tokens=False)["input_ids"])
            legal = sorted(m.uci() for m in env.board.legal_moves)
            if not legal:
                continue
            conts = [list(tokenizer(m, add_special_tokens=False)["input_ids"]) for m in legal]
            logps = _continuation_logprobs(model, prefix, conts)
            probs = [math.exp(lp) for lp in logps]
            listed_sum += sum(probs)
            expected = env.moves[env.index]
            solution_sum += probs[legal.index(expected)] if expected in legal else 0.0
            moves_sum += len(legal)
            n += 1
    finally:
        if was_training:
            model.train()
    if n == 0:
        return MoveMass(0, 0.0, 0.0, 0.0)
    return MoveMass(n, listed_sum / n, solution_sum / n, moves_sum / n)
