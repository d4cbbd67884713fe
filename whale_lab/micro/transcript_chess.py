"""Chess pre-training dialogues: puzzles from another generator seed, seen through board symmetries.

The policy's chance of the right move depends on what the harness layout shows (mates marked in
SAN, named captures); wrong, illegal and untagged moves get the environment's own feedback.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from typing import Any

from whale_lab.domains.base import Action, Task
from whale_lab.micro.styles import Style, sample_style
from whale_lab.micro.transcript_episode import Policy, RuntimeCache, Transcript, run_episode

PRETRAIN_CHESS_SEED = 7001


def _gives_mate(board: Any, move: Any) -> bool:
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


class ChessPolicy(Policy):
    def __init__(self, env: Any, style: Style, rng: random.Random) -> None:
        from whale_lab.micro.styles import chess_visibility

        self.env = env
        self.style = style
        self.rng = rng
        self.vis = chess_visibility(style.get("layout", "raw"), bool(style.get("notes", False)))
        self.format_slip = rng.random() < 0.03

    def _move(self, uci: str) -> str:
        mo, mc = self.style.get("move")
        return f"{mo}{uci}{mc}"

    def _p_correct(self, board: Any, move: Any) -> float:
        if _gives_mate(board, move):
            return 0.85 if self.vis["san"] else 0.3
        if board.is_capture(move):
            if self.vis["capture_names"]:
                return 0.75
            return 0.45 if self.vis["san"] else 0.2
        if board.gives_check(move):
            return 0.35 if self.vis["san"] else 0.15
        return 0.15

    def _distractor(self, board: Any, correct: Any) -> Any:
        legal = [m for m in board.legal_moves if m != correct]
        if not legal:
            return correct
        forcing = [m for m in legal if board.is_capture(m) or board.gives_check(m)]
        if forcing and self.rng.random() < 0.6:
            return self.rng.choice(forcing)
        return self.rng.choice(legal)

    def _illegal(self, board: Any) -> str:
        import chess

        legal = list(board.legal_moves)
        m = self.rng.choice(legal)
        for _ in range(20):
            to = self.rng.randrange(64)
            cand = chess.Move(m.from_square, to)
            if to != m.from_square and not board.is_legal(cand):
                return cand.uci()
        return m.uci()[:2] + m.uci()[:2]

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        import chess

        env = self.env
        board = env.board
        expected = chess.Move.from_uci(env.moves[env.index])
        last = history[-1]
        if self.format_slip and last["type"] == "observation":
            self.format_slip = False
            return f"The best move is {expected.uci()}."
        if last["type"] == "observation" and self.rng.random() < 0.04:
            return self._move(self._illegal(board))
        if self.rng.random() < self._p_correct(board, expected):
            return self._move(expected.uci())
        return self._move(self._distractor(board, expected).uci())


SYMMETRIES = ("mirror", "flip", "mirror-flip")


def transform_puzzle(p: Any, symmetry: str) -> Any | None:
    """The same puzzle seen through a symmetry of the rules, or None when it does not apply.

    "mirror" flips the ranks and swaps the colours (python-chess `Board.mirror`); "flip" swaps
    files a-h, valid only without castling rights. Both keep every move's meaning, so a solution
    that was unique stays unique; the line is replayed to be sure.
    """
    import chess

    from whale_lab.domains.chess_puzzles import Puzzle, line_problem

    board = chess.Board(p.fen)
    ops = symmetry.split("-")
    if "flip" in ops and board.castling_rights:
        return None

    def square(sq: int) -> int:
        if "mirror" in ops:
            sq = chess.square_mirror(sq)
        if "flip" in ops:
            sq ^= 7
        return sq

    if "mirror" in ops:
        board = board.mirror()
    if "flip" in ops:
        board = board.transform(chess.flip_horizontal)
    moves = []
    for uci in p.moves:
        m = chess.Move.from_uci(uci)
        moves.append(chess.Move(square(m.from_square), square(m.to_square), m.promotion).uci())
    fen = board.fen()
    if line_problem(fen, moves):
        return None
    return Puzzle(
        id=f"{p.id}-{symmetry}",
        fen=fen,
        moves=tuple(moves),
        rating=p.rating,
        themes=p.themes,
        source=f"{p.source}+{symmetry}",
    )


def chess_puzzles(n: int, seed: int = PRETRAIN_CHESS_SEED, *, augment: bool = True) -> list[Any]:
    """Pre-training puzzles from another generator seed, none of them shipped (id or position).

    Generation searches every line exhaustively, so the result is cached on disk; each puzzle
    then also appears through the symmetries of the board (up to four positions per puzzle).
    """
    from whale_lab.domains.chess_puzzles import (
        generate_puzzles,
        load_builtin_puzzles,
        read_puzzles_jsonl,
        write_puzzles_jsonl,
    )
    from whale_lab.models import cache_dir

    path = cache_dir() / "micro-data" / f"chess-puzzles-{seed}-{n}.jsonl"
    if path.exists():
        puzzles = read_puzzles_jsonl(path, replay=False)
    else:
        puzzles = generate_puzzles(n, seed=seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        write_puzzles_jsonl(puzzles, tmp)
        os.replace(tmp, path)
    if augment:
        variants = [v for p in puzzles for v in (transform_puzzle(p, s) for s in SYMMETRIES)]
        puzzles = puzzles + [v for v in variants if v is not None]
    try:
        shipped = load_builtin_puzzles()
    except Exception:  # noqa: BLE001 - no shipped file: nothing to exclude
        shipped = []
    ids = {p.id for p in shipped}
    positions = {p.start_board().board_fen() for p in shipped}
    return [p for p in puzzles if p.id not in ids and p.start_board().board_fen() not in positions]


# Mates are where a reader of the legal-move list can learn most (a `#` marks the move), so they
# are drawn more often than the material-winning kinds.
CHESS_KIND_WEIGHTS = {"mateIn1": 0.45, "mateIn2": 0.2, "hangingPiece": 0.2, "fork": 0.15}
# How a chess transcript's puzzle kind is drawn (`micro pretrain --chess-kinds`): "weighted" by
# CHESS_KIND_WEIGHTS, or "uniform", every kind equally, as the puzzle generator deals them to
# the evaluation splits.
CHESS_KIND_MIXES = ("weighted", "uniform")


def chess_transcripts(
    n: int,
    rng: random.Random,
    puzzles: Sequence[Any],
    cache: RuntimeCache | None = None,
    *,
    h0_share: float | None = None,
    kinds: str = "weighted",
    notes_share: float | None = None,
) -> list[Transcript]:
    """`n` chess dialogues; `h0_share`: the chance a dialogue runs under h0 whole (None: the
    documented `styles.CHESS_H0_SHARE`; 0: every legal-move layout, h0's raw one included,
    drawn with equal weight); `kinds`: one of CHESS_KIND_MIXES; `notes_share`: the chance a
    layout in `styles.NOTE_LAYOUTS` also names what each move does (`styles.chess_style`; None:
    the documented `styles.CHESS_NOTES_SHARE`)."""
    from whale_lab.domains.chess import ChessDomain, ChessEnv

    if kinds not in CHESS_KIND_MIXES:
        raise ValueError(
            f"chess kind mix must be one of {', '.join(CHESS_KIND_MIXES)}, got {kinds!r}"
        )
    cache = cache or RuntimeCache()

    def normalise(raw: Any) -> Action:
        # normalise_action reads nothing from the domain instance
        return ChessDomain.normalise_action(None, raw)  # type: ignore[arg-type]

    out = []
    pools: dict[str, list[Any]] = {}
    for p in puzzles:
        pools.setdefault(p.themes[0] if p.themes else "other", []).append(p)
    for pool in pools.values():
        rng.shuffle(pool)
    names = sorted(pools)
    weights = [CHESS_KIND_WEIGHTS.get(k, 1.0) if kinds == "weighted" else 1.0 for k in names]
    drawn = dict.fromkeys(names, 0)
    for i in range(n):
        kind = rng.choices(names, weights)[0]
        p = pools[kind][drawn[kind] % len(pools[kind])]
        drawn[kind] += 1
        board = p.start_board()
        side = "white" if board.turn else "black"
        task = Task(
            id=f"micro-chess-{i:05d}",
            domain="chess",
            fields={
                "question": f"Solve the chess puzzle: you play {side}; find the best move.",
                "fen": board.fen(),
                "side_to_move": side,
            },
            answer={"fen": p.fen, "moves": list(p.moves)},
        )
        style = sample_style("chess", rng, h0_share=h0_share, notes_share=notes_share)
        env = ChessEnv(p.fen, list(p.moves), task_id=task.id)
        out.append(
            run_episode(task, env, normalise, cache.get(style), style, ChessPolicy(env, style, rng))
        )
    return out
