"""The micro model's pre-training recipe: transcripts -> tokenizer -> a small Llama trained from scratch.

`whale-lab micro pretrain [--minutes M] [--out DIR]` runs it end to end on a CPU:

1. build the pre-training transcripts (`transcripts.py`) from the three built-in domains;
2. train a byte-level BPE tokenizer on them, with the project's chat template and special tokens;
3. turn every transcript into token sequences in which only the assistant's replies (and the end
   token after each) carry loss, tokenised exactly as the serving backend and RSFT tokenise them;
4. train a Llama-style causal LM from random weights with AdamW, warm-up and cosine decay, for a
   number of steps fitted to the time budget (re-measured as it runs), then save a normal
   model folder (config, safetensors in bfloat16, tokenizer, generation config) and
   `training_info.json` with the command, seed, data sizes, steps, final loss and wall time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from whale_lab.micro.styles import CHESS_H0_SHARE, CHESS_NOTES_SHARE
from whale_lab.micro.transcript_chess import CHESS_KIND_MIXES
from whale_lab.micro.transcripts import DataSizes, Transcript

IGNORE = -100
DEFAULT_OUT = Path(__file__).resolve().parent / "model"


@dataclass(frozen=True)
class ModelShape:
    hidden: int = 128
    layers: int = 4
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 320
    max_positions: int = 2048


@dataclass(frozen=True)
class PretrainConfig:
    """Everything that decides the result; recorded in training_info.json."""

    minutes: float = 118.0  # wall-time budget for the whole recipe
    out: str = str(DEFAULT_OUT)
    seed: int = 0
    data: DataSizes = field(default_factory=DataSizes)
    shape: ModelShape = field(default_factory=ModelShape)
    vocab_size: int = 1024
    max_len: int = 1024  # longer sequences are cut from the left (earliest context first)
    batch_tokens: int = 4096  # padded tokens per optimiser step
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 30
    weight_decay: float = 0.05
    # Loss weight of prompt tokens (questions, passages, boards) relative to replies: their
    # repeated names and moves teach copying, which every reply needs.
    context_loss_weight: float = 0.5
    # Loss weight of a chess reply's tokens relative to other replies: a chess decision is a few
    # tokens in an episode of hundreds, so it gets little of the gradient at weight 1 (with 3 and
    # 1.5 times the chess transcripts, the third version's mass on the solution ended at 0.15
    # against the second's 0.03).
    chess_reply_weight: float = 3.0
    # Mean chance a math reference solution carries a deliberate mistake (None: the base
    # per-difficulty rates, mean 0.524, which the third version was trained with). Math h0 was
    # 46-52% on 8,000, 10,000 and 12,000 math transcripts at the base rates, near their 47%
    # reference success; a 20-minute math-only check with 0.75 raised h0 (25.3% -> 37.5%), and
    # the fifth version, 118 minutes with 0.75, gave 31.2% on 128 val tasks (the third, 90
    # minutes at the base rates: 46.3%): the two changed together (README). The shipped tenth
    # version keeps 0.75: 30.3%.
    math_mistake_rate: float | None = 0.75
    # Chance a chess transcript runs under h0 whole (`styles.chess_style`); the rest draw every
    # legal-move layout with equal weight. 0 makes h0's raw layout one of five like the others,
    # so the layouts a stronger harness can use get as much practice as h0's.
    chess_h0_share: float = CHESS_H0_SHARE
    # How chess puzzle kinds are drawn (`transcript_chess.CHESS_KIND_MIXES`): "weighted" favours
    # mates; "uniform" deals the four kinds equally, as the generator deals them to the splits.
    chess_kinds: str = "weighted"
    # Chance that each list layout other than h0's raw one and the annotated one also names what
    # each move does (captured piece, promotion, check, mate): the information a stronger harness
    # can add, taught in more layouts than one without drawing any layout more often. 0.5 as shipped.
    chess_notes_share: float = CHESS_NOTES_SHARE
    steps: int = 0  # 0: fit the number of steps to the time budget
    threads: int = 2
    save_dtype: str = "bfloat16"
    square_tokens: bool = True  # one token per chess square: a UCI move is two tokens
    move_tokens: bool = False  # one token per UCI move instead (an experiment; add_move_tokens)
    autocast_bf16: bool = True  # bfloat16 matmuls on CPU (fp32 master weights): ~1.5x faster
    # Chess is learnt when the model copies a listed legal move: its listed-move mass under h0 on
    # `mass_tasks` chess val puzzles is logged every `mass_every` steps and at the end (0: never).
    mass_every: int = 1000  # each measurement takes 10-20 s of CPU on the micro model
    mass_tasks: int = 32


# ====================================================================== tokenised examples


@dataclass
class Example:
    ids: list[int]
    weights: list[float]  # per target position (aligned with ids), 0 for no loss
    # Which positions are reply tokens: kept apart from the weights, since a prompt token may be
    # weighted as much as a reply (`--context-loss-weight 1`) and must still not count as one.
    reply: list[bool]


def _render_prefix(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(
        [dict(m) for m in messages], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def transcript_examples(
    t: Transcript,
    tokenizer: Any,
    eos_id: int,
    *,
    max_len: int,
    context_weight: float = 0.0,
    reply_weight: float = 1.0,
) -> list[Example]:
    """Token sequences for one transcript, tokenised as the backend renders each turn.

    When every turn's prompt extends the previous turn's prompt and reply (the usual case), the
    whole episode is one sequence with loss on every reply; otherwise each turn is its own example.
    """
    pieces: list[tuple[list[int], list[int]]] = []
    for turn in t.turns:
        prefix = _render_prefix(tokenizer, turn.messages)
        target = _encode(tokenizer, turn.response) + [eos_id]
        pieces.append((prefix, target))
    merged: list[int] = []
    weights: list[float] = []
    reply: list[bool] = []
    ok = True
    for prefix, target in pieces:
        if prefix[: len(merged)] != merged:
            ok = False
            break
        new = prefix[len(merged) :]
        merged += new + target
        weights += [context_weight] * len(new) + [reply_weight] * len(target)
        reply += [False] * len(new) + [True] * len(target)
    if ok:
        examples = [Example(merged, weights, reply)]
    else:
        examples = [
            Example(
                p + tg,
                [context_weight] * len(p) + [reply_weight] * len(tg),
                [False] * len(p) + [True] * len(tg),
            )
            for p, tg in pieces
        ]
    out = []
    for ex in examples:
        if len(ex.ids) > max_len:
            ex = Example(ex.ids[-max_len:], ex.weights[-max_len:], ex.reply[-max_len:])
        if any(ex.reply):
            out.append(ex)
    return out


def _render_plain(messages: Sequence[dict[str, str]]) -> str:
    return "".join(f"<|{m['role']}|>\n{m['content']}<|end|>\n" for m in messages)


SQUARES = [f"{f}{r}" for f in "abcdefgh" for r in "12345678"]


def add_square_tokens(tokenizer: Any) -> int:
    """Give each chess square (a1..h8) its own token.

    The byte-level pre-tokenizer splits letters from digits, so a UCI move would be four
    one-character tokens that recur on every line of a legal-move list, and a small model
    copies them badly; as two square tokens a move is copied as a pair. No other text in the
    data has a letter a-h followed by a digit 1-8 (names are letters only, code uses `_`).
    """
    from tokenizers import AddedToken

    return int(
        tokenizer.add_tokens(
            [
                AddedToken(s, single_word=False, lstrip=False, rstrip=False, normalized=False)
                for s in SQUARES
            ]
        )
    )


def uci_move_shapes() -> list[str]:
    """Every UCI string a legal chess move can have: queen and knight lines, and promotions."""
    shapes = set()
    for f1 in range(8):
        for r1 in range(8):
            for f2 in range(8):
                for r2 in range(8):
                    df, dr = abs(f1 - f2), abs(r1 - r2)
                    if (df, dr) != (0, 0) and (
                        df == 0 or dr == 0 or df == dr or {df, dr} == {1, 2}
                    ):
                        shapes.add(f"{'abcdefgh'[f1]}{r1 + 1}{'abcdefgh'[f2]}{r2 + 1}")
    for f1 in range(8):
        for f2 in range(max(0, f1 - 1), min(8, f1 + 2)):
            for r1, r2 in ((7, 8), (2, 1)):
                for piece in "qrbn":
                    shapes.add(f"{'abcdefgh'[f1]}{r1}{'abcdefgh'[f2]}{r2}{piece}")
    return sorted(shapes)


def add_move_tokens(tokenizer: Any) -> int:
    """Give each UCI move shape (1,968 of them) its own token.

    With square tokens a move is two tokens, and the second must be chosen among every line of
    the legal-move list that starts with the first: the small model wrote the right piece's
    square and then a destination from another line (~75% illegal moves per turn). As one
    token, answering with a listed move is a single copy from the list. Matching is leftmost-
    longest, so "e7e8q" is one token and square tokens still cover squares on their own.
    Measured on an 8-minute chess-only budget it did not help (listed-move mass 0.081 against
    0.080 with square tokens; see the README), so it is off by default.
    """
    from tokenizers import AddedToken

    return int(
        tokenizer.add_tokens(
            [
                AddedToken(m, single_word=False, lstrip=False, rstrip=False, normalized=False)
                for m in uci_move_shapes()
            ]
        )
    )


# ====================================================================== batching


def make_batches(
    examples: Sequence[Example], batch_tokens: int, rng: random.Random
) -> list[list[int]]:
    """Index batches of similar lengths, each within `batch_tokens` padded tokens, shuffled."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    batches: list[list[int]] = []
    cur: list[int] = []
    width = 0
    for i in order:
        n = len(examples[i].ids)
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(examples: Sequence[Example], pad_id: int) -> tuple[Any, Any, Any, Any]:
    """Padded ids, attention mask, loss weights and the reply-token mask of a batch."""
    import torch

    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    weights = torch.zeros((len(examples), width), dtype=torch.float32)
    reply = torch.zeros((len(examples), width), dtype=torch.bool)
    for j, e in enumerate(examples):
        n = len(e.ids)
        ids[j, :n] = torch.tensor(e.ids)
        mask[j, :n] = 1
        weights[j, :n] = torch.tensor(e.weights)
        reply[j, :n] = torch.tensor(e.reply)
    return ids, mask, weights, reply


def weighted_loss(
    model: Any, ids: Any, mask: Any, weights: Any, reply_mask: Any
) -> tuple[Any, float]:
    """Weighted next-token NLL (mean over target weight) and the replies-only mean for logging."""
    import torch
    import torch.nn.functional as F

    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    targets = ids[:, 1:]
    w = weights[:, 1:]
    nll = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), reduction="none"
    ).view_as(targets)
    loss = (nll * w).sum() / w.sum().clamp(min=1.0)
    with torch.no_grad():
        reply = reply_mask[:, 1:].float()
        reply_loss = float((nll * reply).sum() / reply.sum().clamp(min=1.0))
    return loss, reply_loss


# ====================================================================== model


def build_model(shape: ModelShape, tokenizer: Any, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions,
        rope_theta=10000.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
        initializer_range=0.02,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = None
    return model


class ThreadTuner:
    """Use the faster of `max_threads` and one thread, re-checked as the run goes.

    On a quiet machine two threads are faster; on a busy one, threads that spin-wait on each
    other can make every step several times slower than one thread. The current setting is timed
    for `trial` steps, then the other one for `trial` steps, and the faster (seconds per token)
    is kept until the next check, `period` steps later (the first check comes early). The
    result does not depend on the thread count.
    """

    def __init__(self, max_threads: int, log: Log, period: int = 150, trial: int = 6) -> None:
        import torch

        self.torch = torch
        self.options = [max_threads, 1] if max_threads > 1 else [1]
        self.current = self.options[0]
        self.period, self.trial = period, trial
        self.start = 2  # first check right after warm-up
        self.cost: dict[int, list[float]] = {n: [] for n in self.options}
        self.log = log
        torch.set_num_threads(self.current)

    def before(self, step: int) -> None:
        if len(self.options) < 2:
            return
        if step == self.start + self.trial:  # time the other setting
            other = self.options[1] if self.current == self.options[0] else self.options[0]
            self.torch.set_num_threads(other)
        elif step == self.start + 2 * self.trial:  # decide
            best = min(self.options, key=lambda n: _mean(self.cost[n]) or float("inf"))
            if best != self.current:
                self.log(f"      {best} thread(s) are faster now: switching")
            self.current = best
            self.torch.set_num_threads(best)
            self.cost = {n: [] for n in self.options}
            self.start = step + self.period

    def after(self, step: int, tokens: int, seconds: float) -> None:
        if len(self.options) < 2 or not self.start <= step < self.start + 2 * self.trial:
            return
        n = self.torch.get_num_threads()
        if n in self.cost:
            self.cost[n].append(seconds / max(1, tokens))


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _lr_at(step: int, total: int, cfg: PretrainConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, total - cfg.warmup_steps))
    cos = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cos)


# ====================================================================== the recipe


Log = Callable[[str], None]


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pretrain(cfg: PretrainConfig, log: Log = _say) -> dict[str, Any]:
    """Run the whole recipe; returns the training_info dict (also written into the folder)."""
    import torch

    from whale_lab.micro.transcripts import build_transcripts
    from whale_lab.models import train_byte_bpe_tokenizer
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    t_start = time.perf_counter()
    budget_s = cfg.minutes * 60.0
    rng = random.Random(f"whale-micro-pretrain:{cfg.seed}")

    log(
        f"[1/4] transcripts: math {cfg.data.math}, search {cfg.data.search}, "
        f"chess {cfg.data.chess} (from {cfg.data.chess_puzzles} puzzles)"
    )
    transcripts = build_transcripts(
        cfg.data,
        seed=cfg.seed,
        math_mistake_rate=cfg.math_mistake_rate,
        chess_h0_share=cfg.chess_h0_share,
        chess_kinds=cfg.chess_kinds,
        chess_notes_share=cfg.chess_notes_share,
    )
    t_data = time.perf_counter() - t_start

    log(f"[2/4] tokenizer: byte-level BPE, {cfg.vocab_size} tokens")
    texts = [_render_plain(t.final_messages()) for t in transcripts]
    tokenizer = train_byte_bpe_tokenizer(texts, vocab_size=cfg.vocab_size)
    if cfg.square_tokens:
        add_square_tokens(tokenizer)
    if cfg.move_tokens:
        add_move_tokens(tokenizer)
    eos_id = int(tokenizer.eos_token_id)
    examples: list[Example] = []
    for t in transcripts:
        examples += transcript_examples(
            t,
            tokenizer,
            eos_id,
            max_len=cfg.max_len,
            context_weight=cfg.context_loss_weight,
            reply_weight=cfg.chess_reply_weight if t.domain == "chess" else 1.0,
        )
    n_tokens = sum(len(e.ids) for e in examples)
    n_targets = sum(sum(e.reply) for e in examples)
    log(f"      {len(examples)} sequences, {n_tokens} tokens, {n_targets} reply tokens")

    log("[3/4] model")
    model = build_model(cfg.shape, tokenizer, cfg.seed)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"      Llama {cfg.shape.layers}x{cfg.shape.hidden}, {n_params / 1e6:.2f}M parameters")
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    batches: list[list[int]] = []
    epoch = 0

    def next_batch() -> list[int]:
        nonlocal batches, epoch
        if not batches:
            batches = make_batches(examples, cfg.batch_tokens, rng)
            epoch += 1
        return batches.pop()

    pad_id = int(tokenizer.pad_token_id)
    mass_probe = _mass_probe(cfg, tokenizer)
    mass_log: list[dict[str, float]] = []

    def measure_mass(at: int) -> None:
        if mass_probe is None:
            return
        t_mass = time.perf_counter()
        m = mass_probe(model)
        mass_log.append(
            {"step": at, "listed": round(m.listed, 4), "solution": round(m.solution, 4)}
        )
        log(f"      step {at}  chess {m.summary()}  ({time.perf_counter() - t_mass:.1f}s)")

    tuner = ThreadTuner(cfg.threads, log)
    model.train()
    total_steps = cfg.steps or 10**9
    fitted = bool(cfg.steps)
    t_train = time.perf_counter()
    losses: list[float] = []
    step = 0
    probe = 8
    marks: list[tuple[int, float]] = []  # (step, time) for the recent speed
    mode = f"fixed {cfg.steps} steps" if cfg.steps else "steps fitted to the budget"
    log(f"[4/4] training ({mode})")
    while step < total_steps:
        if cfg.steps == 0 and (step == probe or (step > probe and step % 25 == 0)):
            # Fit (and keep re-fitting) the number of steps to the time left, from the speed of
            # the last ~100 steps, so the cosine schedule ends when the budget does even when
            # the machine gets busier or quieter on the way.
            now = time.perf_counter()
            marks.append((step, now))
            first = next((m for m in marks if m[0] >= step - 100), marks[0])
            if first[0] == step:
                per_step = (now - t_train) / step
            else:
                per_step = (now - first[1]) / (step - first[0])
            left = budget_s - (now - t_start) - 20.0  # keep time to save
            new_total = max(step + 1, step + int(left / per_step))
            if not fitted:
                log(f"      {per_step:.2f} s/step -> {new_total} steps")
            total_steps, fitted = new_total, True
        lr = _lr_at(step, total_steps if fitted else 10**6, cfg)
        for group in opt.param_groups:
            group["lr"] = lr
        tuner.before(step)
        t_step = time.perf_counter()
        ids, mask, weights, reply = collate([examples[i] for i in next_batch()], pad_id)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.autocast_bf16):
            loss, reply_loss = weighted_loss(model, ids, mask, weights, reply)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(reply_loss)
        tuner.after(step, int(ids.numel()), time.perf_counter() - t_step)
        step += 1
        if step % 25 == 0 or step == total_steps:
            recent = sum(losses[-25:]) / len(losses[-25:])
            log(
                f"      step {step}/{total_steps}  reply loss {recent:.3f}  lr {lr:.2e}  "
                f"epoch {epoch}  {time.perf_counter() - t_start:.0f}s"
            )
        if cfg.mass_every and step % cfg.mass_every == 0 and step < total_steps:
            measure_mass(step)
        if cfg.steps == 0 and time.perf_counter() - t_start > budget_s * 1.1:
            log("      time budget exceeded: stopping early")
            break
    train_s = time.perf_counter() - t_train
    if mass_probe is not None and (not mass_log or mass_log[-1]["step"] != step):
        measure_mass(step)

    out = Path(cfg.out)
    info = {
        "command": _command(),
        "seed": cfg.seed,
        "config": asdict(cfg),
        "data": {
            "transcripts": len(transcripts),
            "by_domain": {
                d: sum(1 for t in transcripts if t.domain == d) for d in ("math", "search", "chess")
            },
            "sequences": len(examples),
            "tokens": n_tokens,
            "reply_tokens": n_targets,
            "reference_success": {
                d: round(
                    sum(t.reward for t in transcripts if t.domain == d)
                    / max(1, sum(1 for t in transcripts if t.domain == d)),
                    3,
                )
                for d in ("math", "search", "chess")
            },
        },
        "parameters": n_params,
        "steps": step,
        "epochs": round(
            step / max(1, len(make_batches(examples, cfg.batch_tokens, random.Random(0)))), 2
        ),
        "first_loss": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
        "final_loss": round(sum(losses[-25:]) / max(1, len(losses[-25:])), 4),
        "data_seconds": round(t_data, 1),
        "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "torch": torch.__version__,
        "threads": cfg.threads,
        "listed_move_mass": mass_log,  # chess, under h0, on chess val puzzles, by step
    }
    save_model(model, tokenizer, out, cfg.save_dtype, info)
    info["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    (out / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"saved {out} ({info['wall_seconds']:.0f}s, final reply loss {info['final_loss']})")
    return info


def _mass_probe(cfg: PretrainConfig, tokenizer: Any) -> Callable[[Any], Any] | None:
    """The listed-move mass of a model under chess h0 on `cfg.mass_tasks` chess val puzzles (none
    of them in the pre-training data), or None when it is not measured."""
    if not cfg.mass_every or cfg.data.chess == 0 or cfg.mass_tasks < 1:
        return None
    from whale_lab.config import load_config
    from whale_lab.domains import make_domain
    from whale_lab.micro.move_mass import listed_move_mass
    from whale_lab.micro.styles import HARNESS_DIR

    dcfg = load_config(None, ['domain.name="chess"', f"domain.splits.val={cfg.mass_tasks}"])
    domain = make_domain(dcfg)
    tasks = domain.tasks("val")
    h0 = HARNESS_DIR / "chess" / "h0.py"
    return lambda model: listed_move_mass(model, tokenizer, domain, tasks, h0)


def _command() -> str:
    """How this run was started, as a user would type it."""
    argv = [str(a) for a in sys.argv[1:]]
    if argv[:2] == ["micro", "pretrain"]:
        return " ".join(["whale-lab", *argv])
    if sys.argv and sys.argv[0].endswith(("pretrain.py", "whale_lab.micro.pretrain")):
        return " ".join(["python -m whale_lab.micro.pretrain", *argv])
    return " ".join(sys.argv)


def save_model(model: Any, tokenizer: Any, out: Path, dtype: str, info: dict[str, Any]) -> None:
    """Write the folder atomically: a temp folder beside it, then a rename."""
    import shutil

    import torch

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.eval()
    save = model
    if dtype != "float32":
        save = model.to({"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype])
    save.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "training_info.json").write_text(json.dumps(info, indent=2) + "\n")
    if out.exists():
        old = out.with_name(out.name + f".old{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
    if dtype != "float32":
        model.to(torch.float32)


# ====================================================================== command line


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `whale-lab micro pretrain`."""
    d = PretrainConfig()
    p.add_argument(
        "--minutes",
        type=float,
        default=d.minutes,
        help=f"wall-time budget for the whole recipe (default {d.minutes:g})",
    )
    p.add_argument("--out", default=d.out, help="model folder to write (default: the shipped one)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--steps",
        type=int,
        default=0,
        help="train exactly this many steps instead of fitting them to --minutes",
    )
    p.add_argument("--math", type=int, default=d.data.math, help="math transcripts (%(default)s)")
    p.add_argument(
        "--search", type=int, default=d.data.search, help="search transcripts (%(default)s)"
    )
    p.add_argument(
        "--chess", type=int, default=d.data.chess, help="chess transcripts (%(default)s)"
    )
    p.add_argument(
        "--chess-puzzles",
        type=int,
        default=d.data.chess_puzzles,
        help="distinct generated chess puzzles behind the chess transcripts",
    )
    p.add_argument(
        "--math-mistake-rate",
        type=float,
        default=d.math_mistake_rate,
        help="mean chance a math reference solution carries a deliberate mistake, the "
        f"per-difficulty spread kept (default {d.math_mistake_rate:g}, the shipped recipe; "
        "the base rates average 0.524)",
    )
    p.add_argument(
        "--chess-h0-share",
        type=float,
        default=d.chess_h0_share,
        help="chance a chess transcript runs under h0 whole; the rest draw every legal-move "
        f"layout with equal weight (default {d.chess_h0_share:g})",
    )
    p.add_argument(
        "--chess-kinds",
        choices=CHESS_KIND_MIXES,
        default=d.chess_kinds,
        help="how chess puzzle kinds are drawn: weighted towards mates, or uniform as the "
        f"puzzle generator deals them to the evaluation splits (default {d.chess_kinds})",
    )
    p.add_argument(
        "--chess-notes-share",
        type=float,
        default=d.chess_notes_share,
        help="chance that each list layout other than h0's raw one and the annotated one also "
        "names what each move does (captured piece, promotion, check, mate) "
        f"(default {d.chess_notes_share:g}, the shipped recipe; at 0 only the annotated layout "
        "does)",
    )
    p.add_argument("--hidden", type=int, default=d.shape.hidden)
    p.add_argument("--layers", type=int, default=d.shape.layers)
    p.add_argument("--vocab", type=int, default=d.vocab_size)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument(
        "--context-loss-weight",
        type=float,
        default=d.context_loss_weight,
        help="loss weight of prompt tokens relative to reply tokens",
    )
    p.add_argument(
        "--chess-reply-weight",
        type=float,
        default=d.chess_reply_weight,
        help="loss weight of chess reply tokens relative to other replies "
        f"(default {d.chess_reply_weight:g})",
    )
    p.add_argument(
        "--batch-tokens", type=int, default=d.batch_tokens, help="padded tokens per optimiser step"
    )
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument(
        "--mass-every",
        type=int,
        default=d.mass_every,
        help="log the chess listed-move mass under h0 every this many steps and at the end "
        f"(0: never; default {d.mass_every})",
    )
    p.add_argument(
        "--mass-tasks",
        type=int,
        default=d.mass_tasks,
        help=f"chess val puzzles the listed-move mass is measured on (default {d.mass_tasks})",
    )
    p.add_argument(
        "--move-tokens",
        action="store_true",
        help="one token per UCI move shape instead of two square tokens (an experiment)",
    )


def config_from_args(args: argparse.Namespace) -> PretrainConfig:
    """A PretrainConfig from parsed options, with clear errors for impossible values."""
    d = PretrainConfig()
    checks = [
        ("--minutes", args.minutes > 0, "must be > 0"),
        ("--steps", args.steps >= 0, "must be >= 0"),
        ("--math", args.math >= 0, "must be >= 0"),
        ("--search", args.search >= 0, "must be >= 0"),
        ("--chess", args.chess >= 0, "must be >= 0"),
        ("--chess-puzzles", args.chess_puzzles >= 1 or args.chess == 0, "must be >= 1"),
        ("--hidden", args.hidden >= 16 and args.hidden % 32 == 0, "must be a multiple of 32"),
        ("--layers", args.layers >= 1, "must be >= 1"),
        ("--vocab", args.vocab >= 300, "must be >= 300 (256 bytes + special tokens + merges)"),
        ("--threads", args.threads >= 1, "must be >= 1"),
        ("--context-loss-weight", 0.0 <= args.context_loss_weight <= 1.0, "must be in 0..1"),
        ("--chess-reply-weight", args.chess_reply_weight >= 1.0, "must be >= 1"),
        ("--batch-tokens", args.batch_tokens >= 64, "must be >= 64"),
        ("--lr", args.lr > 0, "must be > 0"),
        ("--mass-every", args.mass_every >= 0, "must be >= 0"),
        ("--mass-tasks", args.mass_tasks >= 1, "must be >= 1"),
        ("--chess-h0-share", 0.0 <= args.chess_h0_share <= 1.0, "must be in 0..1"),
        ("--chess-notes-share", 0.0 <= args.chess_notes_share <= 1.0, "must be in 0..1"),
        (
            "--math-mistake-rate",
            args.math_mistake_rate is None or 0.0 <= args.math_mistake_rate <= 1.0,
            "must be in 0..1",
        ),
    ]
    for name, ok, why in checks:
        if not ok:
            value = getattr(args, name[2:].replace("-", "_"))
            raise ValueError(f"whale-lab micro pretrain: {name} {why}, got {value}")
    if args.math + args.search + args.chess == 0:
        raise ValueError(
            "whale-lab micro pretrain: --math, --search and --chess are all 0: no data"
        )
    heads = max(1, args.hidden // 32)
    shape = replace(
        d.shape,
        hidden=args.hidden,
        layers=args.layers,
        heads=heads,
        kv_heads=max(1, heads // 2),
        intermediate=(args.hidden * 5 // 2 + 31) // 32 * 32,
    )
    return replace(
        d,
        minutes=args.minutes,
        out=args.out,
        seed=args.seed,
        steps=args.steps,
        data=DataSizes(args.math, args.search, args.chess, args.chess_puzzles),
        shape=shape,
        vocab_size=args.vocab,
        threads=args.threads,
        context_loss_weight=args.context_loss_weight,
        chess_reply_weight=args.chess_reply_weight,
        math_mistake_rate=args.math_mistake_rate,
        chess_h0_share=args.chess_h0_share,
        chess_kinds=args.chess_kinds,
        chess_notes_share=args.chess_notes_share,
        batch_tokens=args.batch_tokens,
        lr=args.lr,
        move_tokens=args.move_tokens,
        mass_every=args.mass_every,
        mass_tasks=args.mass_tasks,
    )


def run_pretrain(args: argparse.Namespace) -> int:
    """`whale-lab micro pretrain`: returns the exit status."""
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"whale-lab: error: {exc}", file=sys.stderr)
        return 2
    pretrain(cfg)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m whale_lab.micro.pretrain",
        description="Pre-train the micro model from scratch.",
    )
    add_arguments(p)
    return run_pretrain(p.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
