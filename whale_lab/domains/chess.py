"""The chess puzzle domain: Lichess-layout puzzles, one environment per episode, a move verifier.

Episode rules (WHALE): the environment plays the opponent's trigger move at reset; the solver must
play each solution move in UCI; after each correct move the opponent's reply is played
automatically; a legal wrong move ends the episode (`wrong_move`, reward 0), except that on the
final solver move any checkmate is accepted, as Lichess does; an illegal move is answered with
`feedback_kind="illegal"` and a verifier message naming the move and why (the rollout loop charges
the illegal-move budget); reward 1 only when the whole line is played (`solved`). Unparseable
output never reaches the environment: `normalise_action` makes it `invalid` and the rollout loop
charges the format budget.

WHALE's rule that a harness may present and parse but never choose is enforced here too, on the
reply the model actually wrote: `ChessEnv.check_reply` refuses a parsed move that the reply does not
name (as UCI or SAN), and the rollout loop records that turn as a `harness_chose_move` format
failure.

The observation is plain text in the layout the WHALE chess harness contract expects: side to move,
FEN, an ASCII board, the opponent's last move, the moves accepted so far, and the legal moves as
lines like ``- [e2e4] SAN=e4``.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import chess

from whale_lab.config import split_seed
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task
from whale_lab.domains.chess_puzzles import Puzzle, line_problem, load_builtin_puzzles
from whale_lab.domains.errors import DataError
from whale_lab.domains.loaders import fit_split_sizes

if TYPE_CHECKING:
    from whale_lab.config import Config

log = logging.getLogger(__name__)

NO_MOVE = "__no_move__"
AMBIGUOUS = "__ambiguous_multiple_moves__"
_SENTINEL_REASONS = {
    NO_MOVE: "no move found in the reply; answer with exactly one UCI move such as e2e4",
    AMBIGUOUS: "the reply names more than one move; answer with exactly one UCI move",
}
_UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")
# The feedback kind of a turn whose parsed move the model's reply does not name.
HARNESS_CHOSE_MOVE = "harness_chose_move"
_FULL_SCAN_LIMIT = 100_000  # replay every row of files up to this size; larger: only used rows


def _side(color: chess.Color) -> str:
    return "white" if color == chess.WHITE else "black"


# ------------------------------------------------------------------ observation


def board_ascii(board: chess.Board) -> str:
    """Ranks 8..1 top to bottom, files a..h; White upper case, Black lower case, '.' empty."""
    rows = []
    for rank in range(7, -1, -1):
        cells = []
        for file in range(8):
            piece = board.piece_at(chess.square(file, rank))
            cells.append(piece.symbol() if piece else ".")
        rows.append(f"{rank + 1} " + " ".join(cells))
    rows.append("  a b c d e f g h")
    return "\n".join(rows)


def legal_move_lines(board: chess.Board) -> list[str]:
    """`- [uci] SAN=san` for every legal move, sorted by UCI."""
    rows = sorted((m.uci(), board.san(m)) for m in board.legal_moves)
    return [f"- [{uci}] SAN={san}" for uci, san in rows]


def render_observation(
    board: chess.Board,
    last_opponent_move: str | None,
    last_opponent_san: str | None,
    accepted: Sequence[str],
) -> str:
    """The text a harness receives for the position the solver now faces."""
    side = _side(board.turn).capitalize()
    last = f"{last_opponent_move} (SAN {last_opponent_san})" if last_opponent_move else "none"
    lines = [
        f"Side to move: {side} (you play {side})",
        f"FEN: {board.fen()}",
        "Board (White upper case, Black lower case):",
        board_ascii(board),
        f"Opponent's last move: {last}",
        "Your moves accepted so far: " + (" ".join(accepted) if accepted else "none"),
        f"Legal moves ({board.legal_moves.count()}):",
        *legal_move_lines(board),
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------ verifier messages


_PIECE_NAMES = {
    chess.PAWN: "pawn",
    chess.KNIGHT: "knight",
    chess.BISHOP: "bishop",
    chess.ROOK: "rook",
    chess.QUEEN: "queen",
    chess.KING: "king",
}


def explain_illegal(board: chess.Board, uci: str) -> str:
    """Why `uci` is not a legal move in `board`, phrased for the model."""
    head = f"Illegal move {uci}"
    tail = " Choose one of the legal moves listed."
    if not _UCI.match(uci):
        return f"{head}: not a UCI move (expected like e2e4, e1g1 or e7e8q).{tail}"
    try:
        move = chess.Move.from_uci(uci)
    except ValueError:
        return f"{head}: not a move (the from and to squares must differ).{tail}"
    side = _side(board.turn)
    frm, to = chess.square_name(move.from_square), chess.square_name(move.to_square)
    piece = board.piece_at(move.from_square)
    if piece is None:
        return f"{head}: there is no piece on {frm}.{tail}"
    name = _PIECE_NAMES[piece.piece_type]
    if piece.color != board.turn:
        return f"{head}: the {name} on {frm} is {_side(piece.color)}'s; you play {side}.{tail}"
    target = board.piece_at(move.to_square)
    last_rank = 7 if board.turn == chess.WHITE else 0
    if (
        piece.piece_type == chess.KING
        and target is not None
        and target.color == board.turn
        and target.piece_type == chess.ROOK
    ):
        return (
            f"{head}: castling is written as the king's two-square move "
            f"(e.g. e1g1 or e8c8), not king-takes-rook.{tail}"
        )
    if target is not None and target.color == board.turn:
        return f"{head}: {to} is occupied by your own {_PIECE_NAMES[target.piece_type]}.{tail}"
    if move.promotion is not None and (
        piece.piece_type != chess.PAWN or chess.square_rank(move.to_square) != last_rank
    ):
        return f"{head}: only a pawn reaching the last rank can promote.{tail}"
    if (
        piece.piece_type == chess.PAWN
        and chess.square_rank(move.to_square) == last_rank
        and move.promotion is None
    ):
        with_q = chess.Move(move.from_square, move.to_square, promotion=chess.QUEEN)
        if board.is_legal(with_q):
            return (
                f"{head}: a pawn reaching the last rank must promote; add the piece, "
                f"e.g. {uci}q (or r, b, n).{tail}"
            )
    if (
        piece.piece_type == chess.KING
        and abs(move.to_square - move.from_square) == 2
        and chess.square_rank(move.from_square) == chess.square_rank(move.to_square)
    ):
        return (
            f"{head}: castling is not allowed here (the king or rook has moved, the king is "
            f"in check, or the path is blocked or attacked).{tail}"
        )
    if board.is_pseudo_legal(move):
        if board.is_check():
            return f"{head}: your king is in check and this move does not end the check.{tail}"
        return (
            f"{head}: it would leave your king in check (the {name} is pinned or the king "
            f"would step into an attack).{tail}"
        )
    return f"{head}: a {name} on {frm} cannot move to {to} in this position.{tail}"


# ------------------------------------------------------------------ environment


class ChessEnv(Env):
    """One puzzle episode. Built from the Lichess layout: `fen` before the trigger, `moves`."""

    def __init__(self, fen: str, moves: Sequence[str], *, task_id: str = "") -> None:
        moves = [m.strip().lower() for m in moves]
        problem = line_problem(fen, moves)
        if problem:
            raise ValueError(f"puzzle {task_id or fen}: {problem}")
        self.task_id = task_id
        self.moves = moves
        self.board = chess.Board(fen)
        trigger = chess.Move.from_uci(moves[0])
        self.last_opponent_san: str | None = self.board.san(trigger)
        self.board.push(trigger)
        self.last_opponent_move: str | None = moves[0]
        self.index = 1  # index in `moves` of the solver move expected next
        self.accepted: list[str] = []
        self.illegal_attempts = 0
        self.faced_legal_moves = self.board.legal_moves.count()
        self.done = False
        self.solved = False

    @property
    def line_length(self) -> int:
        """Plies of the solution line after the trigger (solver moves and replies)."""
        return len(self.moves) - 1

    @property
    def solver_moves_total(self) -> int:
        return len(self.moves[1::2])

    def _is_final(self) -> bool:
        return self.index + 2 >= len(self.moves)

    def observation(self) -> str:
        return render_observation(
            self.board, self.last_opponent_move, self.last_opponent_san, self.accepted
        )

    def initial_observation(self) -> str:
        return self.observation()

    def context(self) -> dict[str, Any]:
        return {
            "turn_count": len(self.accepted),
            "side_to_move": _side(self.board.turn),
            "last_opponent_move": self.last_opponent_move,
        }

    def check_reply(self, action: Action, response: str) -> tuple[str, str, str] | None:
        """Refuse a parsed move the model's reply does not name: (kind, reason, shown), else None.

        The harness may present the position and parse the reply, never choose the move, so the
        check reads the model's own text here, engine side. `reason` (for the trace) names the move
        the parser returned; `shown` (for the model) does not, so a parser cannot pass its choice
        to the model through the feedback.
        """
        if action.kind != "move":
            return None
        uci = re.sub(r"\s+", "", action.value).lower()
        if uci in moves_named(self.board, response):
            return None
        shown = str(response).strip()
        quoted = repr(shown[:37] + "...") if len(shown) > 40 else repr(shown)
        reason = (
            f"the harness chose the move: parse_action returned {uci!r} but the model's reply "
            f"({quoted}) does not name it as UCI or SAN; a harness may parse the model's move, "
            "never choose one"
        )
        return HARNESS_CHOSE_MOVE, reason, _SENTINEL_REASONS[NO_MOVE]

    def step(self, action: Action) -> StepOutcome:
        if self.done:
            raise RuntimeError(f"puzzle {self.task_id}: step() after the episode ended")
        if action.kind != "move":
            return StepOutcome(
                feedback_kind="format", feedback_detail=action.reason or "expected one UCI move"
            )
        uci = re.sub(r"\s+", "", action.value).lower()
        # Legal means listed: python-chess would also take king-takes-rook (e1h1) for castling,
        # but the observation lists e1g1, and so does the WHALE contract's is_legal_action.
        legal = {m.uci(): m for m in self.board.legal_moves}
        move = legal.get(uci)
        if move is None:
            self.illegal_attempts += 1
            return StepOutcome(
                feedback_kind="illegal",
                feedback_detail=explain_illegal(self.board, uci),
                info={"move": uci},
            )
        expected = self.moves[self.index]
        final = self._is_final()
        correct = uci == expected
        if not correct and final:
            self.board.push(move)
            correct = self.board.is_checkmate()  # any mate on the last move counts
            self.board.pop()
        if not correct:
            self.done = True
            return StepOutcome(
                done=True,
                reward=0.0,
                stop_reason="wrong_move",
                observation=f"Wrong move {uci}: not the puzzle's move.",
                info={"move": uci},
            )
        san = self.board.san(move)
        self.board.push(move)
        self.accepted.append(uci)
        reply_index = self.index + 1
        mate = self.board.is_checkmate()
        if final or mate:
            if reply_index < len(self.moves) and not mate:  # a trailing reply ends the line
                self.board.push(chess.Move.from_uci(self.moves[reply_index]))
            self.done = self.solved = True
            return StepOutcome(
                done=True,
                reward=1.0,
                stop_reason="solved",
                observation=f"Correct: {uci} ({san}). Puzzle solved.",
                info={"move": uci},
            )
        reply = chess.Move.from_uci(self.moves[reply_index])
        self.last_opponent_san = self.board.san(reply)
        self.board.push(reply)
        self.last_opponent_move = self.moves[reply_index]
        self.index += 2
        self.faced_legal_moves = self.board.legal_moves.count()
        return StepOutcome(
            observation=self.observation(),
            info={"move": uci, "opponent_reply": self.last_opponent_move},
        )

    def final_info(self) -> dict[str, Any]:
        """Counts for diagnostics.

        `legal_moves`: how many legal moves the solver had in the last position it faced;
        plies count solver moves and the replies played after them.
        """
        if self.solved:
            solved_plies = self.line_length
        else:
            solved_plies = 2 * len(self.accepted)
        return {
            "legal_moves": self.faced_legal_moves,
            "illegal_attempts": self.illegal_attempts,
            "solved_plies": min(solved_plies, self.line_length),
            "line_length": self.line_length,
            "solver_moves": len(self.accepted),
            "solver_moves_total": self.solver_moves_total,
        }


# ------------------------------------------------------------------ actions


def normalise_move_text(text: str) -> Action:
    """A UCI move string (any case, stray whitespace) or a sentinel -> Action."""
    cleaned = re.sub(r"\s+", "", str(text)).lower()
    if not cleaned:
        return Action(kind="invalid", reason="empty reply; answer with one UCI move such as e2e4")
    if cleaned in _SENTINEL_REASONS:
        return Action(kind="invalid", reason=_SENTINEL_REASONS[cleaned])
    if not _UCI.match(cleaned):
        shown = str(text).strip()
        if len(shown) > 40:
            shown = shown[:37] + "..."
        return Action(
            kind="invalid",
            reason=f"{shown!r} is not a UCI move (expected like e2e4, e1g1 or e7e8q)",
        )
    return Action(kind="move", value=cleaned)


# ------------------------------------------------------------------ the model's own move

_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9=+#:-]*")
# UCI or long algebraic, any legality: e2e4, E2E4, e2-e4, e4xd5, Ng1-f3, e7e8q, e7e8=Q
_LONG = re.compile(r"[KQRBNP]?([a-h][1-8])[-x:]?([a-h][1-8])=?([qrbn])?", re.IGNORECASE)
_CASTLING = re.compile(r"[0O](?:-[0O]){1,2}", re.IGNORECASE)


def _san_forms(san: str) -> set[str]:
    """How a reply may write one SAN move: as is, or without the check mark, the '=' or the 'x'."""
    base = san.rstrip("+#")
    forms = {base, base.replace("=", "")}
    return forms | {f.replace("x", "") for f in forms}


def moves_named(board: chess.Board, text: str) -> set[str]:
    """The moves (UCI) that `text` names: any UCI or long-algebraic token, and the SAN of any
    legal move in `board`.

    Matching ignores case, except that a SAN written in the exact case of a legal move names
    only that move (in a position with both, Bxc3 is the bishop's capture and bxc3 the pawn's).
    """
    exact: dict[str, set[str]] = {}
    folded: dict[str, set[str]] = {}
    for move in board.legal_moves:
        uci = move.uci()
        for form in _san_forms(board.san(move)):
            exact.setdefault(form, set()).add(uci)
            folded.setdefault(form.lower(), set()).add(uci)
    named: set[str] = set()
    for raw in _TOKEN.findall(str(text or "")):
        token = raw.rstrip("+#=:-")
        if _CASTLING.fullmatch(token):
            token = token.upper().replace("0", "O")
        long = _LONG.fullmatch(token)
        if long:
            named.add("".join(g or "" for g in long.groups()).lower())
        if token in exact:
            named |= exact[token]
        else:
            named |= folded.get(token.lower(), set())
    return named


# ------------------------------------------------------------------ domain


def _allocate(
    available: int, requested: Mapping[str, int], source: str
) -> tuple[dict[str, int], str]:
    """Split sizes by the rule every domain uses for too-small data (`loaders.fit_split_sizes`):
    test, val and harness in full or a DataError; weight takes what is left, with a warning."""
    have = (
        f"the built-in puzzle set has {available} puzzles"
        if source == "builtin"
        else f"{source}: {available} puzzles"
    )
    return fit_split_sizes(available, requested, have, "chess")


def _replay(p: Puzzle) -> None:
    """A DataError naming the file and line when the puzzle's line does not hold."""
    problem = line_problem(p.fen, p.moves)
    if problem:
        where = f"{p.source}:{p.line}" if p.line else p.source
        raise DataError(f"{where}: puzzle {p.id}: {problem}")


class ChessDomain(Domain):
    """Chess puzzles from the shipped generated set or a Lichess puzzle CSV."""

    name = "chess"

    def __init__(
        self,
        puzzles: Sequence[Puzzle],
        *,
        seed: int = 0,
        sizes: Mapping[str, int] | None = None,
        source: str = "builtin",
        replay_selected: bool = False,
    ) -> None:
        requested = dict(sizes or {"weight": 512, "harness": 32, "val": 32, "test": 32})
        unknown = set(requested) - set(SPLITS)
        if unknown:
            raise ValueError(f"unknown split(s) {sorted(unknown)}; splits are {', '.join(SPLITS)}")
        ids: dict[str, Puzzle] = {}
        for p in puzzles:
            if p.id in ids:
                raise DataError(f"{source}: duplicate puzzle id {p.id!r}")
            ids[p.id] = p
        if not ids:
            raise DataError(f"{source}: no puzzles")
        self.source = source
        self.seed = seed
        self.requested = {k: int(requested.get(k, 0)) for k in SPLITS}
        self.notes: list[str] = []
        order = sorted(ids)
        random.Random(f"whale-lab-chess-splits:{seed}").shuffle(order)
        try:
            self.sizes, note = _allocate(len(order), self.requested, source)
        except DataError:
            if replay_selected:  # a broken row is the first thing to fix: name it before the count
                for p in ids.values():
                    _replay(p)
            raise
        if note:
            self.notes.append(note)  # printed as a warning by fit_split_sizes
        self._splits: dict[str, list[Task]] = {}
        start = 0
        # test first, so the test split depends only on the seed and its own size
        for split in ("test", "val", "harness", "weight"):
            chosen = [ids[i] for i in order[start : start + self.sizes[split]]]
            start += self.sizes[split]
            if replay_selected:
                for p in chosen:
                    _replay(p)
            self._splits[split] = [self._task(p) for p in chosen]

    @classmethod
    def from_config(cls, cfg: Config) -> ChessDomain:
        """`domain.source`: "builtin", a Lichess puzzle CSV (plain or .gz), or our JSONL."""
        from whale_lab.domains.chess_puzzles import read_puzzles_jsonl
        from whale_lab.domains.lichess import load_lichess_csv

        sizes = {k: getattr(cfg.domain.splits, k) for k in SPLITS}
        source = cfg.domain.source.strip()
        if source in ("", "builtin"):
            return cls(load_builtin_puzzles(), seed=split_seed(cfg), sizes=sizes, source="builtin")
        path = Path(source).expanduser()
        if not path.exists():
            raise DataError(
                f'domain.source: {path}: file not found (use "builtin" or the '
                f"path of a Lichess puzzle CSV)"
            )
        if path.name.lower().endswith(".jsonl"):
            return cls(read_puzzles_jsonl(path), seed=split_seed(cfg), sizes=sizes, source=str(path))
        # Replay every row of a modest file; index a big one cheaply and replay what is used.
        puzzles = load_lichess_csv(path, replay=False)
        full = len(puzzles) <= _FULL_SCAN_LIMIT
        if full:
            puzzles = load_lichess_csv(path, replay=True)
        domain = cls(
            puzzles, seed=split_seed(cfg), sizes=sizes, source=str(path), replay_selected=not full
        )
        if not full:
            domain.notes.append(
                f"{path}: {len(puzzles)} rows; only the rows used in the splits were replayed"
            )
        return domain

    def _task(self, p: Puzzle) -> Task:
        board = p.start_board()
        side = _side(board.turn)
        return Task(
            id=p.id,
            domain=self.name,
            fields={
                "question": f"Solve the chess puzzle: you play {side}; find the best move.",
                "fen": board.fen(),
                "side_to_move": side,
            },
            answer={"fen": p.fen, "moves": list(p.moves)},
            meta={
                "rating": p.rating,
                "themes": list(p.themes),
                "source": p.source,
                "solver_moves": len(p.solver_moves),
            },
        )

    def tasks(self, split: Split) -> list[Task]:
        if split not in self._splits:
            raise ValueError(f"unknown split {split!r}; splits are {', '.join(SPLITS)}")
        return list(self._splits[split])

    def make_env(self, task: Task) -> ChessEnv:
        answer = task.answer
        if not isinstance(answer, Mapping) or "fen" not in answer or "moves" not in answer:
            raise ValueError(f"task {task.id} is not a chess puzzle (domain {task.domain!r})")
        return ChessEnv(str(answer["fen"]), list(answer["moves"]), task_id=task.id)

    @staticmethod
    def sample_observation(
        fen: str, last_uci: str = "", last_san: str = "", accepted: Sequence[str] = ()
    ) -> str:
        """A position rendered as a harness sees it, for contract checks that know no domain."""
        return render_observation(chess.Board(fen), last_uci or None, last_san or None, accepted)

    def normalise_action(self, raw: Any) -> Action:
        """str: a UCI move or a sentinel; dict: per docs/design.md; None or anything else: invalid."""
        if raw is None:
            return Action(kind="invalid", reason="the parser found no move (returned None)")
        if isinstance(raw, str):
            return normalise_move_text(raw)
        if isinstance(raw, Mapping):
            kind = raw.get("type")
            if kind == "move":
                move = raw.get("move", raw.get("value"))
                if not isinstance(move, str):
                    return Action(kind="invalid", reason="a move action needs 'move': a UCI string")
                return normalise_move_text(move)
            if kind == "answer":
                content = raw.get("content")
                if not isinstance(content, str):
                    return Action(kind="invalid", reason="an answer needs 'content': a UCI string")
                return normalise_move_text(content)
            if kind == "invalid":
                return Action(kind="invalid", reason=str(raw.get("reason") or "invalid reply"))
            if kind == "tool":
                return Action(
                    kind="invalid", reason="the chess domain has no tools; answer with one UCI move"
                )
            return Action(kind="invalid", reason=f"unknown action type {kind!r}")
        return Action(
            kind="invalid",
            reason=f"the parser returned a {type(raw).__name__}, expected a UCI string",
        )
