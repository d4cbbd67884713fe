"""Base chess harness h0, written to the WHALE chess harness contract.

Deliberately weak, as in the paper: it shows the verifier's observation as is, asks for one
<move>uci</move>, reads only that tag, and allows 1 format retry, 1 illegal-move retry and 9 turns.
It never chooses or searches for a move.
"""

import re

SYSTEM_PROMPT = (
    "You are solving a chess puzzle. Reply with exactly one move in UCI notation "
    "inside <move></move> tags."
)

USER_PROMPT = """Find the best move in this chess puzzle.

{observation}

Answer with one move as <move>uci</move>, for example <move>e2e4</move>."""

FORMAT_RETRY_BUDGET = 1
ILLEGAL_MOVE_RETRY_BUDGET = 1
MAX_TURNS = 9

_UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"
_TAGGED = re.compile(r"<move>\s*(" + _UCI + r")\s*</move>", re.IGNORECASE)
_LISTED = re.compile(r"\[\s*(" + _UCI + r")\s*\]", re.IGNORECASE)


def format_observation(observation: str, **kw: object) -> str:
    return str(observation)


def parse_action(response: str) -> str:
    moves = []
    for match in _TAGGED.finditer(str(response or "")):
        move = match.group(1).lower()
        if move not in moves:
            moves.append(move)
    if not moves:
        return "__no_move__"
    if len(moves) > 1:
        return "__ambiguous_multiple_moves__"
    return moves[0]


def propose_action(board: str) -> str:
    return ""


def is_legal_action(board: str, action: str) -> bool:
    if not isinstance(action, str):
        return False
    move = action.strip().lower()
    if not re.fullmatch(_UCI, move):
        return False
    listed = {m.group(1).lower() for m in _LISTED.finditer(str(board))}
    return move in listed
