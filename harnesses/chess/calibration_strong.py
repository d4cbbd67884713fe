"""A stronger chess harness, used to measure how much the harness alone can add (calibration).

Written to the WHALE chess contract. Against h0 it annotates every legal move with what it does
(the piece it captures, promotion, check, checkmate), drops the ASCII board, explains the notation
in a system prompt, allows ten format and ten illegal-move retries (the contract's most), and
starts every retry from the clean position: a rejected reply and the verifier's feedback on it are
left out of the context (`select_context`), so the model samples the move again as if for the
first time instead of reading its own mistake. It never chooses or searches for a move:
`propose_action` returns "".
"""

import re

SYSTEM_PROMPT = (
    "You play chess puzzles. Each turn, choose one legal move and write it in UCI as "
    "<move>e2e4</move>. A move marked # gives checkmate; x captures; + gives check."
)
USER_PROMPT = """Find the best move in this chess puzzle.

{observation}

Answer with one move as <move>uci</move>, for example <move>e2e4</move>."""

FORMAT_RETRY_BUDGET = 10
ILLEGAL_MOVE_RETRY_BUDGET = 10
MAX_TURNS = 12

_UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"
_LINE = re.compile(r"^- \[(" + _UCI + r")\] SAN=(\S+)")
_TAGGED = re.compile(r"<move>\s*(" + _UCI + r")\s*</move>", re.IGNORECASE)
_NAMES = {"p": "pawn", "n": "knight", "b": "bishop", "r": "rook", "q": "queen", "k": "king"}


def _pieces(fen):
    squares = {}
    rows = fen.split(" ")[0].split("/") if fen else []
    for r, row in enumerate(rows):
        file = 0
        for ch in row:
            if ch.isdigit():
                file += int(ch)
            else:
                squares["abcdefgh"[file] + str(8 - r)] = ch
                file += 1
    return squares


def format_observation(observation, **kw):
    text = str(observation)
    fen, side, last, moves = "", str(kw.get("side_to_move") or ""), "none", []
    for line in text.splitlines():
        if line.startswith("FEN:"):
            fen = line[4:].strip()
        elif line.startswith("Side to move:"):
            side = line.split(":", 1)[1].strip().split()[0].lower()
        elif line.startswith("Opponent's last move:"):
            last = line.split(":", 1)[1].strip()
        match = _LINE.match(line)
        if match:
            moves.append((match.group(1), match.group(2)))
    if not moves:
        return text
    squares = _pieces(fen)
    lines = [
        "You play " + side + ". Opponent's last move: " + last + ".",
        "FEN: " + fen,
        "Legal moves:",
    ]
    for uci, san in moves:
        notes = []
        if "x" in san:
            notes.append("captures " + _NAMES.get(squares.get(uci[2:4], "p").lower(), "piece"))
        if "=" in san:
            notes.append("promotes")
        if san.endswith("#"):
            notes.append("checkmate")
        elif san.endswith("+"):
            notes.append("check")
        lines.append("- " + uci + " (" + san + ")" + (": " + ", ".join(notes) if notes else ""))
    return "\n".join(lines)


def parse_action(response):
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


def propose_action(board):
    return ""


def is_legal_action(board, action):
    if not isinstance(action, str):
        return False
    move = action.strip().lower()
    if not re.fullmatch(_UCI, move):
        return False
    listed = {m.group(1).lower() for m in re.finditer(r"\[\s*(" + _UCI + r")\s*\]", str(board))}
    return move in listed


# Marks feedback, which select_context leaves out together with the reply it answers.
_REJECTED = "Rejected: "


def format_feedback(kind, detail, **context):
    return _REJECTED + str(detail)


def select_context(messages, **context):
    kept = []
    for message in messages:
        rejected = message.get("role") == "user" and str(message.get("content", "")).startswith(
            _REJECTED
        )
        if rejected:
            if kept and kept[-1].get("role") == "assistant":
                kept.pop()
            continue
        kept.append(message)
    return kept
