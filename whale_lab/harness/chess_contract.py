"""The WHALE chess harness contract, checked at validation.

A chess harness written for WHALE runs here unchanged. Beyond the general contract it must keep to
a stricter import list, define `propose_action(board)` and `is_legal_action(board, action)` (both
receive the visible observation text), keep each retry budget in 0..10 and `MAX_TURNS` at most 18,
and have `USER_PROMPT` place the `{observation}`. `propose_action` must return "" on real boards:
the harness presents the position and parses the reply; it never chooses a move itself.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from whale_lab.harness.ast_check import check_source, parse_source

if TYPE_CHECKING:
    from whale_lab.harness.host import HarnessHost

CHESS_ALLOWED_IMPORTS: frozenset[str] = frozenset(
    {"__future__", "collections", "itertools", "math", "random", "re", "statistics"}
)
MAX_RETRY_BUDGET = 10
MAX_TURNS_CAP = 18
REQUIRED_FUNCTIONS = ("propose_action", "is_legal_action")
CONTRACT = "the WHALE chess contract"

# (FEN, the opponent's last move in UCI and SAN, the solver's moves accepted so far).
SAMPLE_POSITIONS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "e2e4", "e4", ()),
    (
        "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4",
        "g8f6",
        "Nf6",
        ("d1h5",),
    ),
    ("6k1/P4ppp/8/8/8/8/5PPP/6K1 w - - 0 1", "", "", ()),
)


# Renders (FEN, last UCI, last SAN, accepted moves) as the observation text a harness receives.
ObservationRenderer = Callable[[str, str, str, tuple[str, ...]], str]
# (observation text, keyword context, one legal UCI move) for one sample position.
SampleBoard = tuple[str, dict[str, Any], str]


def documented_observation(
    fen: str, last_uci: str = "", last_san: str = "", accepted: tuple[str, ...] = ()
) -> str:
    """The documented layout, for callers that name a domain without handing over its renderer."""
    import chess

    board = chess.Board(fen)
    side = "white" if board.turn == chess.WHITE else "black"
    lines = [
        f"Side to move: {side}",
        f"FEN: {board.fen()}",
        "Board:",
        str(board),
        f"Opponent's last move: {last_uci or 'none'}",
        f"Moves played so far: {' '.join(accepted) if accepted else 'none'}",
        "Legal moves:",
    ]
    lines += [f"- [{m.uci()}] SAN={board.san(m)}" for m in board.legal_moves]
    return "\n".join(lines)


def sample_boards(render: ObservationRenderer = documented_observation) -> list[SampleBoard]:
    """(observation text, keyword context, one legal UCI move) for each sample position.

    `render` comes from the layer that knows the domain, so the text is what a harness really sees.
    """
    import chess

    out = []
    for fen, last_uci, last_san, accepted in SAMPLE_POSITIONS:
        board = chess.Board(fen)
        ctx = {
            "turn_count": len(accepted),
            "side_to_move": "white" if board.turn == chess.WHITE else "black",
            "last_opponent_move": last_uci or None,
            "max_turns": MAX_TURNS_CAP,
        }
        legal = sorted(m.uci() for m in board.legal_moves)[0]
        out.append((render(fen, last_uci, last_san, accepted), ctx, legal))
    return out


def static_problems(source: str, filename: str = "<harness>") -> list[str]:
    """Contract problems visible in the code alone: imports and the required functions."""
    problems = [
        f"{filename}:{p.line}: {p.message}" if p.line else f"{filename}: {p.message}"
        for p in check_source(source, filename, CHESS_ALLOWED_IMPORTS, contract=CONTRACT)
    ]
    if problems:
        return problems
    tree = parse_source(source, filename)
    defined = {
        node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    for name in REQUIRED_FUNCTIONS:
        if name not in defined:
            problems.append(f"{filename}: {CONTRACT} requires a top-level function {name}()")
    return problems


def _int_problem(name: str, value: Any, lo: int, hi: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        return f"{name} must be an int in {lo}..{hi} under {CONTRACT}, got {value!r}"
    return None


def check_chess_contract(host: HarnessHost, boards: Sequence[SampleBoard]) -> list[str]:
    """Every way a loaded harness breaks the WHALE chess contract; empty when it keeps to it.

    `boards` (see `sample_boards`) are rendered by the caller, which knows the domain.
    """
    path = str(host.path)
    problems = static_problems(host.source, path)
    if problems:
        return problems
    info = host.info
    if "{observation}" not in info.user_prompt:
        problems.append(f"{path}: USER_PROMPT must contain {{observation}} under {CONTRACT}")
    for name, value, lo, hi in (
        ("FORMAT_RETRY_BUDGET", info.format_retry_budget, 0, MAX_RETRY_BUDGET),
        ("ILLEGAL_MOVE_RETRY_BUDGET", info.illegal_move_retry_budget, 0, MAX_RETRY_BUDGET),
        ("MAX_TURNS", info.max_turns, 1, MAX_TURNS_CAP),
    ):
        problem = _int_problem(name, value, lo, hi)
        if problem:
            problems.append(f"{path}: {problem}")

    for n, res in enumerate(host.call("propose_action", [[obs] for obs, _, _ in boards]), 1):
        if not res.ok:
            problems.append(
                f"{path}: propose_action failed on sample board {n}: {res.kind}: {res.error}"
            )
        elif res.value != "":
            problems.append(
                f'{path}: propose_action must return "" (the harness may not choose moves), '
                f"returned {res.value!r:.80} on sample board {n}"
            )
    legal_calls = [[obs, move] for obs, _, move in boards] + [[boards[0][0], "a1a1"]]
    for n, res in enumerate(host.call("is_legal_action", legal_calls), 1):
        if not res.ok:
            problems.append(
                f"{path}: is_legal_action failed on sample call {n}: {res.kind}: {res.error}"
            )
        elif not isinstance(res.value, bool):
            problems.append(
                f"{path}: is_legal_action must return a bool, got "
                f"{type(res.value).__name__} on sample call {n}"
            )

    renders = host.render(
        [
            {"fields": {}, "history": [{"type": "observation", "observation": obs}], "context": ctx}
            for obs, ctx, _ in boards
        ]
    )
    for n, res in enumerate(renders, 1):
        if not res.ok:
            problems.append(f"{path}: rendering sample board {n} failed: {res.kind}: {res.error}")
    parsed = host.parse(
        [{"response": f"<move>{move}</move>", "context": ctx} for _, ctx, move in boards]
    )
    for n, res in enumerate(parsed, 1):
        if not res.ok:
            problems.append(
                f"{path}: parse_action failed on sample reply {n}: {res.kind}: {res.error}"
            )
    return problems
