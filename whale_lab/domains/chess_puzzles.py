"""Chess puzzles in the Lichess layout, and a seeded generator whose solutions are proven unique.

A puzzle is stored as Lichess stores it: `fen` is the position *before* the opponent's trigger
move, `moves = [trigger, solver1, reply1, solver2, ...]` in UCI. The generator makes four kinds:

- ``mateIn1``: exactly one legal move mates;
- ``mateIn2``: no mate in one, exactly one first move forces mate next move, and after the stored
  reply exactly one move mates;
- ``hangingPiece``: exactly one move wins at least `MIN_GAIN` points of material against every
  reply (the opponent's trigger left a piece en prise);
- ``fork``: exactly one move forks two targets, and after the opponent's best reply exactly one
  move (the forking piece taking a target) cashes in at least `MIN_GAIN` points.

"Exactly one" is checked by a small exhaustive search: every legal move at each solver step is
searched full width to the end of the line, then captures only (quiescence), with material counted
P=1, N=B=3, R=5, Q=9, mate above everything and stalemate below everything. The search is the
definition of the goal, so `verify_puzzle` can re-check any stored puzzle.

Generation is a pure function of `(n, seed)`; `generate_puzzles(n, seed)[:k]` equals
`generate_puzzles(k, seed)`, because the four kinds come from separate seeded streams taken in
turn. Positions are sparse random placements (an endgame-like board with a few pieces) plus one
random opponent move as the trigger; a placement is kept only when that trigger creates a puzzle
of the wanted kind.

The shipped file ``whale_lab/data/chess_puzzles.jsonl`` was made by::

    write_puzzles_jsonl(generate_puzzles(BUILTIN_COUNT, seed=BUILTIN_SEED), BUILTIN_PATH)

that is ``generate_puzzles(800, seed=2026)`` (`regenerate_builtin()` repeats it, about three CPU
minutes). Every puzzle in it passes `verify_puzzle`.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chess

from whale_lab.domains.errors import DataError

BUILTIN_SEED = 2026
BUILTIN_COUNT = 800
BUILTIN_PATH = Path(__file__).resolve().parent.parent / "data" / "chess_puzzles.jsonl"

KINDS = ("mateIn1", "hangingPiece", "mateIn2", "fork")
MIN_GAIN = 2  # material points over the position before the trigger that count as "winning"

PIECE_VALUES = {
    chess.PAWN: 1,
    chess.KNIGHT: 3,
    chess.BISHOP: 3,
    chess.ROOK: 5,
    chess.QUEEN: 9,
    chess.KING: 0,
}
MATE = 1000
DRAW = -500  # a stalemate never counts as winning material
_QDEPTH = 8


# ------------------------------------------------------------------ the puzzle record


@dataclass(frozen=True)
class Puzzle:
    """One puzzle line in the Lichess layout (see the module docstring)."""

    id: str
    fen: str  # before the trigger move
    moves: tuple[str, ...]  # trigger, solver1, reply1, solver2, ... (may end on a reply)
    rating: int | None = None
    themes: tuple[str, ...] = ()
    source: str = ""  # "generated", or the file it was read from
    line: int = 0  # line in `source` (0 when not from a file); for error messages
    extra: Mapping[str, Any] = field(default_factory=dict)  # optional Lichess columns

    @property
    def trigger(self) -> str:
        return self.moves[0]

    @property
    def solver_moves(self) -> tuple[str, ...]:
        return self.moves[1::2]

    def start_board(self) -> chess.Board:
        """The position the solver faces: `fen` with the trigger move played."""
        board = chess.Board(self.fen)
        board.push(chess.Move.from_uci(self.trigger))
        return board

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "fen": self.fen,
            "moves": list(self.moves),
            "rating": self.rating,
            "themes": list(self.themes),
        }
        if self.extra:
            d["extra"] = dict(self.extra)
        return d


def line_problem(fen: str, moves: Sequence[str]) -> str | None:
    """Why `fen` + `moves` is not a playable puzzle line, or None when it is.

    Checks the FEN, that there is a trigger and at least one solver move, and that every move is
    UCI and legal in turn. A line may end on an opponent reply after the last solver move (some
    trimmed copies of the Lichess database do); that reply is simply played.
    """
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        return f"bad FEN {fen!r}: {exc}"
    status = board.status()
    if status != chess.STATUS_VALID:
        return f"FEN {fen!r} is not a legal position ({_status_text(status)})"
    if len(moves) < 2:
        return f"Moves must hold the trigger and at least one solver move, got {len(moves)} move(s)"
    for i, uci in enumerate(moves):
        who = "trigger" if i == 0 else ("solver" if i % 2 else "reply")
        try:
            move = chess.Move.from_uci(uci)
        except ValueError:
            return f"move {i + 1} ({who}) {uci!r} is not a UCI move"
        if not board.is_legal(move):
            return f"move {i + 1} ({who}) {uci} is illegal in {board.fen()}"
        board.push(move)
    return None


def _status_text(status: chess.Status) -> str:
    names = [
        name.lower().replace("_", " ")
        for name, flag in chess.Status.__members__.items()
        if flag and flag in status and name != "VALID"
    ]
    return ", ".join(names) or "invalid"


# ------------------------------------------------------------------ jsonl storage


def write_puzzles_jsonl(puzzles: Iterable[Puzzle], path: str | Path) -> None:
    """One JSON object per line, in the order given."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(pz.to_json(), sort_keys=True) + "\n" for pz in puzzles)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(p)


def read_puzzles_jsonl(path: str | Path, *, replay: bool = True) -> list[Puzzle]:
    """Read puzzles written by `write_puzzles_jsonl`; a bad line is a DataError naming it.

    The file may start with a UTF-8 byte-order mark; a file that is not UTF-8 is a DataError too.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p}: {'not a file' if p.exists() else 'file not found'}")
    try:
        return _read_puzzle_lines(p, replay)
    except UnicodeDecodeError as exc:
        raise DataError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _read_puzzle_lines(p: Path, replay: bool) -> list[Puzzle]:
    out: list[Puzzle] = []
    seen: dict[str, int] = {}
    with p.open(encoding="utf-8-sig") as fh:
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            where = f"{p}:{lineno}"
            try:
                d = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON: {exc}") from None
            except RecursionError:
                raise DataError(f"{where}: JSON nested too deeply") from None
            if not isinstance(d, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(d).__name__}")
            missing = [k for k in ("id", "fen", "moves") if k not in d]
            if missing:
                raise DataError(f"{where}: missing key(s) {', '.join(missing)}")
            moves = d["moves"]
            if isinstance(moves, str):
                moves = moves.split()
            if not isinstance(moves, list) or not all(isinstance(m, str) for m in moves):
                raise DataError(f"{where}: 'moves' must be a list of UCI strings")
            pid = str(d["id"])
            if pid in seen:
                raise DataError(f"{where}: duplicate puzzle id {pid!r} (first on line {seen[pid]})")
            seen[pid] = lineno
            rating = d.get("rating")
            if rating is not None and (isinstance(rating, bool) or not isinstance(rating, int)):
                raise DataError(f"{where}: 'rating' must be an integer or null, got {rating!r}")
            themes = d.get("themes") or []
            if isinstance(themes, str):
                themes = themes.split()
            if not isinstance(themes, list) or not isinstance(d.get("extra") or {}, dict):
                raise DataError(f"{where}: 'themes' must be a list and 'extra' an object")
            moves_t = tuple(m.strip().lower() for m in moves)
            if replay:
                problem = line_problem(str(d["fen"]), moves_t)
                if problem:
                    raise DataError(f"{where}: puzzle {pid}: {problem}")
            out.append(
                Puzzle(
                    id=pid,
                    fen=str(d["fen"]),
                    moves=moves_t,
                    rating=rating,
                    themes=tuple(str(t) for t in themes),
                    source=str(p),
                    line=lineno,
                    extra=dict(d.get("extra") or {}),
                )
            )
    return out


def load_builtin_puzzles() -> list[Puzzle]:
    """The shipped, pre-generated set (see the module docstring for the call that made it)."""
    if not BUILTIN_PATH.exists():
        raise DataError(f"{BUILTIN_PATH}: the built-in chess puzzles are missing from the install")
    return [
        Puzzle(
            id=p.id,
            fen=p.fen,
            moves=p.moves,
            rating=p.rating,
            themes=p.themes,
            source="builtin",
            line=p.line,
            extra=p.extra,
        )
        for p in read_puzzles_jsonl(BUILTIN_PATH)
    ]


# ------------------------------------------------------------------ search


def material(board: chess.Board, color: chess.Color) -> int:
    """Material of `color` minus the other side's, in pawns."""
    total = 0
    for piece_type, value in PIECE_VALUES.items():
        if value:
            total += value * (
                len(board.pieces(piece_type, color)) - len(board.pieces(piece_type, not color))
            )
    return total


def _capture_value(board: chess.Board, move: chess.Move) -> int:
    if board.is_en_passant(move):
        return 1
    piece = board.piece_at(move.to_square)
    return PIECE_VALUES[piece.piece_type] if piece else 0


def _ordered(board: chess.Board, moves: list[chess.Move]) -> list[chess.Move]:
    """Captures (most valuable victim first) and promotions before quiet moves; stable."""

    def key(m: chess.Move) -> tuple[int, int]:
        if board.is_capture(m):
            return (0, -10 * _capture_value(board, m) + (board.piece_type_at(m.from_square) or 0))
        return (1, 0) if m.promotion else (2, 0)

    return sorted(moves, key=key)


def _quiesce(board: chess.Board, solver: chess.Color, alpha: int, beta: int, depth: int) -> int:
    moves = list(board.legal_moves)
    in_check = board.is_check()
    if not moves:
        if in_check:
            return -MATE if board.turn == solver else MATE
        return DRAW
    maximising = board.turn == solver
    if in_check:
        candidates = moves
        best = -MATE - 1 if maximising else MATE + 1
    else:
        best = material(board, solver)  # stand pat
        if depth <= 0:
            return best
        if maximising:
            if best >= beta:
                return best
            alpha = max(alpha, best)
        else:
            if best <= alpha:
                return best
            beta = min(beta, best)
        candidates = [m for m in moves if board.is_capture(m) or m.promotion == chess.QUEEN]
    if depth <= 0:  # in check at the depth limit: count material, the line is long enough
        return material(board, solver)
    for move in _ordered(board, candidates):
        board.push(move)
        value = _quiesce(board, solver, alpha, beta, depth - 1)
        board.pop()
        if maximising:
            best = max(best, value)
            alpha = max(alpha, value)
        else:
            best = min(best, value)
            beta = min(beta, value)
        if alpha >= beta:
            break
    return best


def search(
    board: chess.Board,
    solver: chess.Color,
    plies: int,
    alpha: int = -MATE - 1,
    beta: int = MATE + 1,
) -> int:
    """Minimax material balance for `solver`: `plies` full-width plies, then quiescence."""
    moves = list(board.legal_moves)
    if not moves:
        if board.is_check():
            return -MATE if board.turn == solver else MATE
        return DRAW
    if plies <= 0:
        return _quiesce(board, solver, alpha, beta, _QDEPTH)
    maximising = board.turn == solver
    best = -MATE - 1 if maximising else MATE + 1
    for move in _ordered(board, moves):
        board.push(move)
        value = search(board, solver, plies - 1, alpha, beta)
        board.pop()
        if maximising:
            best = max(best, value)
            alpha = max(alpha, value)
        else:
            best = min(best, value)
            beta = min(beta, value)
        if alpha >= beta:
            break
    return best


def reaches(board: chess.Board, solver: chess.Color, plies: int, target: int) -> bool:
    """Whether `solver` can force a material balance of at least `target` (null-window search)."""
    return search(board, solver, plies, target - 1, target) >= target


def winning_moves(
    board: chess.Board, plies_after: int, target: int, limit: int | None = None
) -> list[chess.Move]:
    """The solver's moves (side to move) that force `target` with `plies_after` more full plies."""
    solver = board.turn
    found: list[chess.Move] = []
    for move in _ordered(board, list(board.legal_moves)):
        board.push(move)
        ok = reaches(board, solver, plies_after, target)
        board.pop()
        if ok:
            found.append(move)
            if limit is not None and len(found) >= limit:
                break
    return found


def mating_moves(board: chess.Board, limit: int | None = None) -> list[chess.Move]:
    """Moves of the side to move that checkmate at once."""
    found: list[chess.Move] = []
    for move in board.legal_moves:
        if not board.gives_check(move):
            continue
        board.push(move)
        mate = board.is_checkmate()
        board.pop()
        if mate:
            found.append(move)
            if limit is not None and len(found) >= limit:
                break
    return found


def _forces_mate_next(board: chess.Board) -> bool:
    """After a solver move (opponent to move): every reply allows a mate in one."""
    replies = list(board.legal_moves)
    if not replies:
        return board.is_check()  # mate already; stalemate is not
    for reply in replies:
        board.push(reply)
        ok = bool(mating_moves(board, limit=1))
        board.pop()
        if not ok:
            return False
    return True


def mate_in_two_moves(board: chess.Board, limit: int | None = None) -> list[chess.Move]:
    """First moves that force mate on the next move (a mate in one also qualifies)."""
    found: list[chess.Move] = []
    checks_first = sorted(board.legal_moves, key=lambda m: not board.gives_check(m))
    for move in checks_first:
        board.push(move)
        ok = _forces_mate_next(board)
        board.pop()
        if ok:
            found.append(move)
            if limit is not None and len(found) >= limit:
                break
    return found


# ------------------------------------------------------------------ verification


def _attacked_targets(board: chess.Board, square: chess.Square) -> list[chess.Square]:
    """Opponent pieces that the piece on `square` attacks and could profitably take."""
    piece = board.piece_at(square)
    if piece is None:
        return []
    mine = PIECE_VALUES[piece.piece_type] or 100
    targets = []
    for sq in board.attacks(square):
        victim = board.piece_at(sq)
        if victim is None or victim.color == piece.color:
            continue
        if victim.piece_type == chess.KING:
            targets.append(sq)
            continue
        value = PIECE_VALUES[victim.piece_type]
        if value >= 3 and (value > mine or not board.is_attacked_by(victim.color, sq)):
            targets.append(sq)
    return targets


def puzzle_kind(puzzle: Puzzle) -> str | None:
    """The generator kind named in the puzzle's themes, if any."""
    for kind in KINDS:
        if kind in puzzle.themes:
            return kind
    return None


def verify_puzzle(puzzle: Puzzle) -> list[str]:
    """Re-check a generated puzzle: legal line, and each solver move the only one that works.

    Returns the problems found (empty when the puzzle holds). Lichess puzzles carry no kind of
    ours and are only replayed.
    """
    problem = line_problem(puzzle.fen, puzzle.moves)
    if problem:
        return [problem]
    kind = puzzle_kind(puzzle)
    if kind is None:
        return []
    board = chess.Board(puzzle.fen)
    baseline = material(board, not board.turn)
    board.push(chess.Move.from_uci(puzzle.trigger))
    moves = [chess.Move.from_uci(u) for u in puzzle.moves[1:]]
    problems: list[str] = []

    def only(step: int, found: list[chess.Move], goal: str) -> None:
        expected = moves[2 * step]
        if found != [expected]:
            names = " ".join(m.uci() for m in found) or "none"
            problems.append(
                f"solver move {step + 1}: expected {expected.uci()} to be the only "
                f"move that {goal}, found: {names}"
            )

    if kind == "mateIn1":
        if len(moves) != 1:
            return [f"mateIn1 must have one solver move, has {len(puzzle.solver_moves)}"]
        only(0, mating_moves(board), "mates")
    elif kind == "mateIn2":
        if len(moves) != 3:
            return [f"mateIn2 must have two solver moves, has {len(puzzle.solver_moves)}"]
        if mating_moves(board, limit=1):
            problems.append("there is a mate in one")
        only(0, mate_in_two_moves(board, limit=2), "forces mate in two")
        board.push(moves[0])
        board.push(moves[1])
        only(1, mating_moves(board), "mates")
    elif kind == "hangingPiece":
        if len(moves) != 1:
            return [f"hangingPiece must have one solver move, has {len(puzzle.solver_moves)}"]
        only(0, winning_moves(board, 1, baseline + MIN_GAIN, limit=2), "wins material")
        if not board.is_capture(moves[0]):
            problems.append("the solution does not capture anything")
    elif kind == "fork":
        if len(moves) != 3:
            return [f"fork must have two solver moves, has {len(puzzle.solver_moves)}"]
        only(0, winning_moves(board, 2, baseline + MIN_GAIN, limit=2), "wins material")
        board.push(moves[0])
        targets = _attacked_targets(board, moves[0].to_square)
        if len(targets) < 2:
            problems.append(f"{moves[0].uci()} attacks fewer than two targets")
        board.push(moves[1])
        only(1, winning_moves(board, 0, baseline + MIN_GAIN, limit=2), "wins material")
        if moves[2].from_square != moves[0].to_square or moves[2].to_square not in targets:
            problems.append("the second solver move is not the forking piece taking a target")
    board = puzzle.start_board()
    for move in moves:
        board.push(move)
    if kind in ("hangingPiece", "fork") and board.is_checkmate():
        problems.append("a material puzzle must not end in mate")
    if kind in ("mateIn1", "mateIn2") and not board.is_checkmate():
        problems.append("the line does not end in mate")
    return problems


# ------------------------------------------------------------------ generation

# Piece menus per kind: (solver extras, opponent extras), each a list of options to choose from.
_MENUS: dict[str, tuple[list[str], list[str]]] = {
    "mateIn1": (
        ["Q", "R", "RR", "QR", "QN", "QB", "RB", "RN", "QP", "RBN"],
        ["", "P", "PP", "N", "B", "R", "PN", "PB", "PPR"],
    ),
    "mateIn2": (
        ["Q", "RR", "QR", "QN", "QB", "RB", "RN", "QP", "RBN", "QRP"],
        ["", "P", "PP", "N", "B", "PN", "PB", "PPR", "R"],
    ),
    "hangingPiece": (
        ["QR", "RB", "RN", "QB", "QN", "BN", "RR", "RBP", "QNP", "BBP"],
        ["QR", "RB", "RN", "QB", "QN", "BN", "RR", "RBP", "QNP", "NNP"],
    ),
    "fork": (
        ["NR", "NB", "NQ", "NP", "NRP", "NBP", "NN", "QB", "NRB"],
        ["QR", "RR", "QB", "RB", "QN", "RN", "QRP", "RRP", "QBP"],
    ),
}
_LETTER_TYPES = {
    "P": chess.PAWN,
    "N": chess.KNIGHT,
    "B": chess.BISHOP,
    "R": chess.ROOK,
    "Q": chess.QUEEN,
}


def _edge_square(rng: random.Random) -> chess.Square:
    if rng.random() < 0.5:
        return chess.square(rng.randrange(8), rng.choice((0, 7)))
    return chess.square(rng.choice((0, 7)), rng.randrange(8))


def _random_placement(rng: random.Random, kind: str, solver: chess.Color) -> chess.Board | None:
    """A sparse legal position with the opponent (the trigger's player) to move, or None."""
    board = chess.Board(None)
    opponent = not solver
    solver_menu, opponent_menu = _MENUS[kind]
    mate_kind = kind.startswith("mate")
    opp_king = _edge_square(rng) if mate_kind and rng.random() < 0.8 else rng.randrange(64)
    board.set_piece_at(opp_king, chess.Piece(chess.KING, opponent))
    free = [sq for sq in chess.SQUARES if sq != opp_king]
    own_king = rng.choice(free)
    board.set_piece_at(own_king, chess.Piece(chess.KING, solver))
    pawn_extra = rng.choice(("", "P", "PP")) if not mate_kind else ""
    layout = [(letter, solver) for letter in rng.choice(solver_menu) + pawn_extra]
    layout += [(letter, opponent) for letter in rng.choice(opponent_menu)]
    for letter, color in layout:
        piece_type = _LETTER_TYPES[letter]
        for _ in range(20):
            if piece_type == chess.PAWN and color == opponent and mate_kind and rng.random() < 0.7:
                # shelter pawns in front of the defending king make mates more natural
                step = -8 if opponent == chess.BLACK else 8
                sq = opp_king + step + rng.choice((-1, 0, 1))
            else:
                sq = rng.randrange(64)
            if not 0 <= sq < 64 or board.piece_at(sq) is not None:
                continue
            if piece_type == chess.PAWN and chess.square_rank(sq) in (0, 7):
                continue
            board.set_piece_at(sq, chess.Piece(piece_type, color))
            break
    board.turn = opponent
    board.castling_rights = chess.BB_EMPTY
    board.fullmove_number = rng.randrange(25, 60)
    if board.status() != chess.STATUS_VALID or board.is_game_over():
        return None
    return board


def _puzzle_id(kind: str, fen: str, moves: Sequence[str]) -> str:
    code = {"mateIn1": "m1", "mateIn2": "m2", "hangingPiece": "hp", "fork": "fk"}[kind]
    digest = hashlib.sha1(f"{fen} {' '.join(moves)}".encode()).hexdigest()[:8]
    return f"gen-{code}-{digest}"


def _rating(kind: str, start: chess.Board, line: Sequence[chess.Move]) -> int:
    """A rough difficulty: base by kind, more for many options and for quiet first moves."""
    base = {"mateIn1": 900, "hangingPiece": 1000, "fork": 1350, "mateIn2": 1500}[kind]
    options = start.legal_moves.count()
    first = line[0]
    quiet = not start.is_capture(first) and not start.gives_check(first)
    rating = base + 6 * (options - 20) + (180 if quiet else 0)
    if first.promotion:
        rating += 100
    return int(max(600, min(2400, rating)))


def _themes(kind: str, start: chess.Board, line: Sequence[chess.Move]) -> tuple[str, ...]:
    themes = [kind]
    solver_moves = len(line[0::2])
    themes.append("oneMove" if solver_moves == 1 else "short")
    if kind.startswith("mate"):
        themes.append("mate")
    else:
        themes.append("advantage")
    if any(m.promotion for m in line[0::2]):
        themes.append("promotion")
    themes.append("endgame")
    return tuple(themes)


def _try_kind(
    kind: str, start: chess.Board, baseline: int, rng: random.Random
) -> list[chess.Move] | None:
    """The solver's line (solver1, reply1, solver2, ...) when `start` is a puzzle of `kind`."""
    if kind == "mateIn1":
        mates = mating_moves(start, limit=2)
        return mates if len(mates) == 1 else None
    if mating_moves(start, limit=1):
        return None  # mate-in-one positions belong to their own kind
    if kind == "mateIn2":
        firsts = mate_in_two_moves(start, limit=2)
        if len(firsts) != 1:
            return None
        start.push(firsts[0])
        options = []
        for reply in start.legal_moves:
            start.push(reply)
            mates = mating_moves(start, limit=2)
            start.pop()
            if len(mates) == 1:
                options.append([firsts[0], reply, mates[0]])
        start.pop()
        return rng.choice(options) if options else None
    target = baseline + MIN_GAIN
    if kind == "hangingPiece":
        if not any(
            start.is_capture(m) and _capture_value(start, m) >= 3 for m in start.legal_moves
        ):
            return None
        wins = winning_moves(start, 1, target, limit=2)
        if len(wins) != 1 or not start.is_capture(wins[0]) or _capture_value(start, wins[0]) < 3:
            return None
        start.push(wins[0])
        mate = start.is_checkmate()
        start.pop()
        return None if mate else wins
    # fork: cheap pattern filter first, then the search
    forks = []
    for move in start.legal_moves:
        start.push(move)
        if len(_attacked_targets(start, move.to_square)) >= 2:
            forks.append(move)
        start.pop()
    if not forks:
        return None
    wins = winning_moves(start, 2, target, limit=2)
    if len(wins) != 1 or wins[0] not in forks:
        return None
    first = wins[0]
    start.push(first)
    targets = set(_attacked_targets(start, first.to_square))
    best: list[tuple[int, list[chess.Move]]] = []
    for reply in _ordered(start, list(start.legal_moves)):
        start.push(reply)
        seconds = winning_moves(start, 0, target, limit=2)
        if len(seconds) == 1:
            second = seconds[0]
            start.push(second)
            value = search(start, not start.turn, 0)
            mate = start.is_checkmate()
            start.pop()
            if not mate and second.from_square == first.to_square and second.to_square in targets:
                best.append((value, [first, reply, second]))
        start.pop()
    start.pop()
    if not best:
        return None
    # the opponent's best defence: the reply that leaves the solver the least
    low = min(v for v, _ in best)
    return rng.choice([line for v, line in best if v == low])


def _stream(kind: str, seed: int) -> Iterator[Puzzle]:
    """An endless, deterministic stream of distinct puzzles of one kind."""
    rng = random.Random(f"whale-lab-chess:{seed}:{kind}")
    seen: set[str] = set()
    while True:
        solver = rng.choice((chess.WHITE, chess.BLACK))
        pre = _random_placement(rng, kind, solver)
        if pre is None:
            continue
        baseline = material(pre, solver)
        triggers = list(pre.legal_moves)
        rng.shuffle(triggers)
        for trigger in triggers[:12]:
            start = pre.copy(stack=False)
            start.push(trigger)
            if start.is_game_over():
                continue
            line = _try_kind(kind, start, baseline, rng)
            if line is None:
                continue
            key = start.board_fen() + (" w" if start.turn else " b")
            if key in seen:
                break
            seen.add(key)
            fen = pre.fen()
            moves = (trigger.uci(), *(m.uci() for m in line))
            yield Puzzle(
                id=_puzzle_id(kind, fen, moves),
                fen=fen,
                moves=moves,
                rating=_rating(kind, start, line),
                themes=_themes(kind, start, line),
                source="generated",
            )
            break


def generate_puzzles(n: int, seed: int = 0) -> list[Puzzle]:
    """`n` verified puzzles, the four kinds in turn; a pure function of `(n, seed)`."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    streams = [_stream(kind, seed) for kind in KINDS]
    out: list[Puzzle] = []
    while len(out) < n:
        out.append(next(streams[len(out) % len(KINDS)]))
    return out


def regenerate_builtin(path: str | Path = BUILTIN_PATH) -> list[Puzzle]:
    """Rewrite the shipped file exactly as it was made (a few minutes on one core)."""
    puzzles = generate_puzzles(BUILTIN_COUNT, seed=BUILTIN_SEED)
    write_puzzles_jsonl(puzzles, path)
    return puzzles
