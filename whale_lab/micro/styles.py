"""The variety of harness styles the micro model is pre-trained under.

A model that only ever saw one prompt would be either blind to the harness or broken by every edit.
Each style here is a real harness file (source text that the harness runtime loads and renders
exactly as the host does), drawn at random from a space of prompt wordings, action tag formats,
observation layouts, numbers of passages, truncation lengths, turn limits, retry budgets and
feedback messages. The base harnesses h0 are part of the mix, as written in `harnesses/`.

A style also tells the reference policy how to write its actions (which tags the prompt asked for)
and what the observation made visible, so that the policy's competence follows the harness in the
way a real model's does: an answer hidden by truncation cannot be copied, a mate marked `#` is easy
to spot, a bare list of squares is not.

The mix favours no harness: every prompt wording, tag format, observation and passage format,
feedback message and legal-move layout in the lists below is drawn with equal weight (so no
proposer mechanism's output format is taught more than any other), and the base harness h0 is
drawn whole at a documented share per domain (`h0_share`) because it is where every run starts.
Turn limits, passage counts and retry budgets keep their stated mixes: they are limits, not
formats. `HELD_OUT` holds one format per surface that is never drawn here; `held_out_harness`
renders h0 and the stronger calibration harness in them, so calibration can measure a lever on
formats the model was never taught (`whale-lab micro calibrate --held-out`).
"""

from __future__ import annotations

import copy
import functools
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS_DIR = REPO_ROOT / "harnesses"


@dataclass(frozen=True)
class Style:
    """One harness: its source, and the facts the reference policy needs about it."""

    domain: str
    name: str
    source: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.params.get(key, default)


def _constants(values: Mapping[str, Any]) -> str:
    return "\n".join(f"{k} = {v!r}" for k, v in values.items())


def _pick(rng: random.Random, options: list[tuple[Any, float]]) -> Any:
    """A weighted choice from (value, weight) pairs."""
    total = sum(w for _, w in options)
    x = rng.random() * total
    for value, w in options:
        x -= w
        if x <= 0:
            return value
    return options[-1][0]


def h0_source(domain: str) -> str:
    path = HARNESS_DIR / domain / "h0.py"
    if not path.exists():
        raise FileNotFoundError(f"base harness {path} is missing")
    return path.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=8)
def _literal_constants(source: str) -> dict[str, Any]:
    """Every `NAME = literal` at the top of a harness source, parsed once per distinct source."""
    import ast

    found: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                continue  # not a literal: h0_constant says it is missing
            for t in node.targets:
                if isinstance(t, ast.Name):
                    found[t.id] = value
    return found


def h0_constant(domain: str, name: str) -> Any:
    """A literal constant of the shipped h0 (read with `ast`, never run), so the facts a style
    gives the reference policy follow the file rather than a copy of it."""
    constants = _literal_constants(h0_source(domain))
    if name not in constants:
        raise KeyError(f"harnesses/{domain}/h0.py has no constant {name}")
    return copy.deepcopy(constants[name])  # the parse is shared: callers get their own


FEEDBACKS = [
    ("{detail}", 1.0),
    ("Error: {detail}", 1.0),
    ("Your reply could not be used: {detail} Try again.", 1.0),
    ("Invalid reply. {detail}", 1.0),
    ("Problem: {detail}\nPlease follow the format.", 1.0),
]


# ====================================================================== search

SEARCH_TAGS = [
    (("<search>", "</search>", "<answer>", "</answer>"), 1.0),
    (("<query>", "</query>", "<answer>", "</answer>"), 1.0),
    (("Search[", "]", "Answer[", "]"), 1.0),
    (("[SEARCH] ", " [/SEARCH]", "[ANSWER] ", " [/ANSWER]"), 1.0),
]
SEARCH_USER = [
    (
        "Answer the question. To search, write {so}your query{sc}. "
        "When you know the answer, write {ao}the answer{ac}.\nQuestion: {{question}}",
        1.0,
    ),
    ("Question: {{question}}\nSearch with {so}query{sc}, answer with {ao}answer{ac}.", 1.0),
    (
        "You can look things up in an encyclopedia. Write {so}words to look up{sc} to search "
        "and {ao}short answer{ac} to answer.\n\nQuestion: {{question}}",
        1.0,
    ),
    ("{{question}}", 1.0),  # the instructions are in the system prompt
    (
        "Find the answer to this question by searching: {{question}}\n"
        "Reply with {so}...{sc} or {ao}...{ac}.",
        1.0,
    ),
]
SEARCH_SYSTEM = [
    ("", 1.0),
    (
        "You answer questions about a fictional world. You know nothing about it, so search "
        "first: write {so}query{sc}. Give the final answer as {ao}answer{ac}, copied from the "
        "passages.",
        1.0,
    ),
    (
        "Use the search tool: {so}query{sc}. Answer with {ao}answer{ac}. Keep answers short: "
        "a name, a place or a number.",
        1.0,
    ),
]
PASSAGE_FORMATS = [
    ("{title}: {text}", 1.0),
    ("[{i}] {title}: {text}", 1.0),
    ("Doc {i} (Title: {title}) {text}", 1.0),
    ("{title}\n{text}", 1.0),
]
OBS_WRAPS = [
    ("<information>{body}</information>", 1.0),
    ('Results for "{query}":\n{body}', 1.0),
    ("{body}", 1.0),
    ("<results>\n{body}\n</results>", 1.0),
]

SEARCH_BODY = r"""
import re


def _cut(text):
    words = str(text).split()
    if SHOWN_WORDS and len(words) > SHOWN_WORDS:
        return " ".join(words[:SHOWN_WORDS]) + " ..."
    return " ".join(words)


def format_observation(observation, **context):
    if not isinstance(observation, dict):
        return ""
    passages = (observation.get("passages") or [])[:SHOWN_PASSAGES]
    if not passages:
        return NO_RESULTS
    parts = []
    for i, p in enumerate(passages, 1):
        parts.append(PASSAGE_FORMAT.format(i=i, title=p.get("title", ""), text=_cut(p.get("text", ""))))
    return OBS_WRAP.format(body=PASSAGE_JOIN.join(parts), query=observation.get("query", ""))


def _between(opening, closing, text):
    found = re.search(re.escape(opening) + r"(.*?)" + re.escape(closing), text, re.S)
    if found and found.group(1).strip():
        return found.group(1).strip()
    return None


def parse_action(response):
    answer = _between(ANSWER_OPEN, ANSWER_CLOSE, response)
    if answer:
        return {"type": "answer", "content": answer}
    query = _between(SEARCH_OPEN, SEARCH_CLOSE, response)
    if query:
        return {"type": "tool", "name": "search", "arguments": {"query": query, "topk": TOPK}}
    return None


def format_feedback(kind, detail, **context):
    return FEEDBACK.format(detail=detail)
"""


def search_style(rng: random.Random, *, h0_share: float = 0.25) -> Style:
    """A search harness: h0 itself, or a random combination of the search surfaces."""
    if rng.random() < h0_share:
        return Style(
            "search",
            "h0",
            h0_source("search"),
            {
                "tags": ("<search>", "</search>", "<answer>", "</answer>"),
                "max_turns": 2,
                "topk": 1,
                "shown_words": h0_constant("search", "SHOWN_WORDS"),
                "format_budget": 1,
            },
        )
    so, sc, ao, ac = _pick(rng, SEARCH_TAGS)
    system = _pick(rng, SEARCH_SYSTEM).format(so=so, sc=sc, ao=ao, ac=ac)
    user = _pick(rng, SEARCH_USER).format(so=so, sc=sc, ao=ao, ac=ac)
    if not system and user == "{question}":
        user = f"Question: {{question}}\nSearch with {so}query{sc}, answer with {ao}answer{ac}."
    topk = _pick(rng, [(1, 3.0), (2, 2.0), (3, 3.0), (5, 1.0)])
    shown_words = _pick(rng, [(12, 2.0), (20, 2.0), (30, 1.0), (0, 3.0)])
    max_turns = _pick(rng, [(2, 3.0), (3, 2.0), (4, 3.0), (6, 1.0)])
    values = {
        "SYSTEM_PROMPT": system,
        "USER_PROMPT": user,
        "MAX_TURNS": max_turns,
        "FORMAT_RETRY_BUDGET": _pick(rng, [(0, 1.0), (1, 3.0), (2, 1.0)]),
        "TOPK": topk,
        "SHOWN_PASSAGES": topk,
        "SHOWN_WORDS": shown_words,
        "PASSAGE_FORMAT": _pick(rng, PASSAGE_FORMATS),
        "PASSAGE_JOIN": _pick(rng, [("\n", 3.0), ("\n\n", 1.0)]),
        "OBS_WRAP": _pick(rng, OBS_WRAPS),
        "NO_RESULTS": "No results.",
        "SEARCH_OPEN": so,
        "SEARCH_CLOSE": sc,
        "ANSWER_OPEN": ao,
        "ANSWER_CLOSE": ac,
        "FEEDBACK": _pick(rng, FEEDBACKS),
    }
    source = '"""A search harness style used in pre-training."""\n\n' + _constants(values)
    source += "\n" + SEARCH_BODY
    params = {
        "tags": (so, sc, ao, ac),
        "max_turns": max_turns,
        "topk": topk,
        "shown_words": shown_words,
        "format_budget": values["FORMAT_RETRY_BUDGET"],
    }
    return Style("search", f"search-{topk}-{shown_words}-{max_turns}", source, params)


# ====================================================================== math

MATH_CALLS = [
    (("<python>\n", "\n</python>"), 1.0),
    (("```python\n", "\n```"), 1.0),
    (("<code>\n", "\n</code>"), 1.0),
]
MATH_ANSWERS = [
    (("\\boxed{", "}"), 1.0),
    (("<answer>", "</answer>"), 1.0),
]
MATH_USER = [
    ("{{question}}\nPut your final answer in \\boxed{{{{}}}}.", 1.0),
    ("{{question}}", 1.0),
    ("Problem: {{question}}\nWrite {co}code{cc} to compute, then give {ao}answer{ac}.", 1.0),
    ("Solve this word problem.\n\n{{question}}\n\nFinal answer format: {ao}number{ac}", 1.0),
    ("{{question}}\nYou may run Python with {co}code{cc}. End with {ao}answer{ac}.", 1.0),
]
MATH_SYSTEM = [
    ("", 1.0),
    (
        "You solve math word problems. You can run Python: write {co}code{cc} and you will see "
        "what it prints. Give the final answer as {ao}number{ac}.",
        1.0,
    ),
    ("Compute with Python ({co}...{cc}), then answer with {ao}...{ac}.", 1.0),
]
MATH_OBS = [
    ("readable", 1.0),  # the default rendering of the tool result, as h0 shows it
    ("output", 1.0),
    ("tagged", 1.0),
    ("terse", 1.0),
]

MATH_BODY = r"""
import re


def format_observation(observation, **context):
    if not isinstance(observation, dict):
        return str(observation or "")
    out = str(observation.get("stdout", ""))
    err = str(observation.get("error", ""))
    if OUTPUT_CHARS and len(out) > OUTPUT_CHARS:
        out = out[:OUTPUT_CHARS] + "..."
    if OBS_LAYOUT == "readable":
        return "code: " + str(observation.get("code", "")) + "\nstdout: " + out + "\nerror: " + err
    if OBS_LAYOUT == "output":
        text = "Output:\n" + out.strip()
        if err:
            text += "\nError:\n" + err
        return text
    if OBS_LAYOUT == "tagged":
        if err:
            return "<output>" + out.strip() + "</output>\n<error>" + err + "</error>"
        return "<output>" + out.strip() + "</output>"
    return (err or out.strip()) or "(no output)"


def _between(opening, closing, text):
    found = re.search(re.escape(opening) + r"(.*?)" + re.escape(closing), text, re.S)
    if found and found.group(1).strip():
        return found.group(1).strip()
    return None


def _boxed(text):
    found = None
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            found = text[match.end() : i - 1].strip()
    return found


def parse_action(response):
    if ANSWER_OPEN == "\\boxed{":
        answer = _boxed(response)
    else:
        answer = _between(ANSWER_OPEN, ANSWER_CLOSE, response)
    if answer:
        return {"type": "answer", "content": answer}
    code = _between(CODE_OPEN.strip(), CODE_CLOSE.strip(), response)
    if code:
        return {"type": "tool", "name": "python", "arguments": {"code": code}}
    return None


def format_feedback(kind, detail, **context):
    return FEEDBACK.format(detail=detail)
"""


def math_style(rng: random.Random, *, h0_share: float = 0.35) -> Style:
    """A math harness: h0 itself, or a random combination of the math surfaces."""
    if rng.random() < h0_share:
        return Style(
            "math",
            "h0",
            h0_source("math"),
            {
                "call": ("<python>\n", "\n</python>"),
                "answer": ("\\boxed{", "}"),
                "max_turns": 2,
                "obs": "readable",
                "format_budget": 1,
            },
        )
    co, cc = _pick(rng, MATH_CALLS)
    ao, ac = _pick(rng, MATH_ANSWERS)
    fmt = {"co": co.replace("\n", " "), "cc": cc.replace("\n", " "), "ao": ao, "ac": ac}
    if ao == "\\boxed{":
        fmt["ao"], fmt["ac"] = "\\boxed{{", "}}"
    system = _pick(rng, MATH_SYSTEM).format(**fmt)
    user = _pick(rng, MATH_USER).format(**fmt)
    if ao != "\\boxed{" and "boxed" in user:
        user = "{question}\nGive the final answer as " + ao + "number" + ac + "."
    max_turns = _pick(rng, [(2, 4.0), (3, 2.0), (4, 2.0)])
    obs = _pick(rng, MATH_OBS)
    values = {
        "SYSTEM_PROMPT": system.replace("{{", "{").replace("}}", "}"),
        "USER_PROMPT": user,
        "MAX_TURNS": max_turns,
        "FORMAT_RETRY_BUDGET": _pick(rng, [(0, 1.0), (1, 3.0), (2, 1.0)]),
        "OBS_LAYOUT": obs,
        "OUTPUT_CHARS": _pick(rng, [(0, 3.0), (200, 1.0)]),
        "CODE_OPEN": co,
        "CODE_CLOSE": cc,
        "ANSWER_OPEN": ao,
        "ANSWER_CLOSE": ac,
        "FEEDBACK": _pick(rng, FEEDBACKS),
    }
    source = '"""A math harness style used in pre-training."""\n\n' + _constants(values)
    source += "\n" + MATH_BODY
    params = {
        "call": (co, cc),
        "answer": (ao, ac),
        "max_turns": max_turns,
        "obs": obs,
        "format_budget": values["FORMAT_RETRY_BUDGET"],
    }
    return Style("math", f"math-{obs}-{max_turns}", source, params)


# ====================================================================== chess

CHESS_MOVES = [
    (("<move>", "</move>"), 1.0),
    (("Move: ", ""), 1.0),
    (("[[", "]]"), 1.0),
]
CHESS_SYSTEM = [
    (
        "You are solving a chess puzzle. Reply with exactly one move in UCI notation "
        "inside {mo}{mc} tags.",
        1.0,
    ),
    ("", 1.0),
    (
        "You play chess puzzles. Each turn, choose one legal move and write it in UCI as "
        "{mo}e2e4{mc}. A move marked # gives checkmate; x captures; + gives check.",
        1.0,
    ),
]
CHESS_USER = [
    (
        "Find the best move in this chess puzzle.\n\n{{observation}}\n\n"
        "Answer with one move as {mo}uci{mc}, for example {mo}e2e4{mc}.",
        1.0,
    ),
    ("{{observation}}\nYour move ({mo}uci{mc}):", 1.0),
    ("Puzzle: you play {{side_to_move}}.\n{{observation}}\nReply {mo}move{mc}.", 1.0),
    ("{{observation}}\n\nPick the move that wins. Write it as {mo}uci{mc}.", 1.0),
]
CHESS_LAYOUTS = [
    ("raw", 1.0),  # the verifier's observation as is (h0)
    ("annotated", 1.0),  # legal moves with capture, check and mate notes
    ("san_list", 1.0),  # one line: uci (san) pairs
    ("board_san", 1.0),  # board + SAN list, no FEN
    ("uci_only", 1.0),  # FEN + bare UCI list: hard to read
]

CHESS_BODY = r"""
import re

_MOVE = re.compile(r"^- \[([a-h][1-8][a-h][1-8][qrbn]?)\] SAN=(\S+)")
_UCI = r"[a-h][1-8][a-h][1-8][qrbn]?"
_NAMES = {"p": "pawn", "n": "knight", "b": "bishop", "r": "rook", "q": "queen", "k": "king"}


def _read(observation):
    text = str(observation)
    info = {"fen": "", "side": "", "last": "", "moves": [], "board": []}
    in_board = False
    for line in text.splitlines():
        if line.startswith("FEN:"):
            info["fen"] = line[4:].strip()
        elif line.startswith("Side to move:"):
            info["side"] = line.split(":", 1)[1].strip().split()[0].lower()
        elif line.startswith("Opponent's last move:"):
            info["last"] = line.split(":", 1)[1].strip()
        elif line.startswith("Board"):
            in_board = True
            continue
        m = _MOVE.match(line)
        if m:
            info["moves"].append((m.group(1), m.group(2)))
            in_board = False
        elif in_board and line.strip() and not line.startswith("Opponent"):
            info["board"].append(line)
        elif in_board and line.startswith("Opponent"):
            in_board = False
    return text, info


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


def _note(uci, san, squares):
    notes = []
    if "x" in san:
        target = squares.get(uci[2:4], "p")
        notes.append("captures " + _NAMES.get(target.lower(), "piece"))
    if "=" in san:
        notes.append("promotes")
    if san.endswith("#"):
        notes.append("checkmate")
    elif san.endswith("+"):
        notes.append("check")
    return ", ".join(notes)


def format_observation(observation, **context):
    text, info = _read(observation)
    if LAYOUT == "raw" or not info["moves"]:
        return text
    side = info["side"] or str(context.get("side_to_move", ""))
    head = "You play " + side + ". Opponent's last move: " + (info["last"] or "none") + "."
    if LAYOUT == "annotated":
        squares = _pieces(info["fen"])
        lines = [head, "FEN: " + info["fen"]]
        if SHOW_BOARD and info["board"]:
            lines += ["Board:"] + info["board"]
        lines.append("Legal moves:")
        for uci, san in info["moves"]:
            note = _note(uci, san, squares)
            lines.append("- " + uci + " (" + san + ")" + (": " + note if note else ""))
        return "\n".join(lines)
    squares = _pieces(info["fen"]) if NOTES else {}

    def noted(text, uci, san, sep):
        note = _note(uci, san, squares) if NOTES else ""
        return text + (sep + note if note else "")

    if LAYOUT == "san_list":
        pairs = ", ".join(noted(uci + " (" + san, uci, san, ": ") + ")" for uci, san in info["moves"])
        return head + "\nFEN: " + info["fen"] + "\nLegal moves: " + pairs
    if LAYOUT == "board_san":
        lines = [head, "Board:"] + info["board"] + ["Legal moves:"]
        lines += [noted("- " + uci + " = " + san, uci, san, ": ") for uci, san in info["moves"]]
        return "\n".join(lines)
    if NOTES:
        listed = ", ".join(noted(uci, uci, san, " ") for uci, san in info["moves"])
    else:
        listed = " ".join(u for u, _ in info["moves"])
    return head + "\nFEN: " + info["fen"] + "\nLegal moves: " + listed


def parse_action(response):
    found = re.findall(re.escape(MOVE_OPEN) + r"\s*(" + _UCI + r")\s*" + re.escape(MOVE_CLOSE),
                       str(response or ""), re.I)
    moves = []
    for move in found:
        if move.lower() not in moves:
            moves.append(move.lower())
    if not moves:
        return "__no_move__"
    if len(moves) > 1:
        return "__ambiguous_multiple_moves__"
    return moves[0]


def format_feedback(kind, detail, **context):
    return FEEDBACK.format(detail=detail)


def propose_action(board):
    return ""


def is_legal_action(board, action):
    if not isinstance(action, str) or not re.fullmatch(_UCI, action.strip().lower()):
        return False
    return action.strip().lower() in {m.group(1) for m in re.finditer(r"\[(" + _UCI + r")\]", str(board))}
"""

# What each layout lets a reader see: marks of mate/check/capture in SAN, named captured pieces.
LAYOUT_VISIBILITY = {
    "raw": {"san": True, "capture_names": False},
    "annotated": {"san": True, "capture_names": True},
    "san_list": {"san": True, "capture_names": False},
    "board_san": {"san": True, "capture_names": False},
    "uci_only": {"san": False, "capture_names": False},
}

#: Layouts that may also carry the move notes (captured piece, promotion, check, mate) beside
#: each move (`micro pretrain --chess-notes-share`); h0's raw layout is the verifier's text as is,
#: and the annotated layout always carries them.
NOTE_LAYOUTS = ("san_list", "board_san", "uci_only")


def chess_visibility(layout: str, notes: bool = False) -> dict[str, bool]:
    """What a chess style shows its reader: `san` (mates and checks marked) and `capture_names`.
    Notes name the captured piece and mark mate and check, whatever the layout's own text."""
    if notes:
        return {"san": True, "capture_names": True}
    return dict(LAYOUT_VISIBILITY.get(layout, LAYOUT_VISIBILITY["raw"]))


#: The documented share of chess transcripts run under h0 whole (`micro pretrain --chess-h0-share`).
#: 0 as shipped: h0's raw layout is one of the five drawn equally, so the layouts a stronger
#: harness can use get as much practice as h0's (0.3 up to the fifth version).
CHESS_H0_SHARE = 0.0
#: The chance a layout in NOTE_LAYOUTS carries the move notes (`--chess-notes-share`). 0.5 as
#: shipped (the tenth version): half the list layouts name captured pieces, so the notes are
#: information the model reads in any layout, not one format's. At 0 only the annotated layout
#: names them: one chess harness in five.
CHESS_NOTES_SHARE = 0.5


def chess_style(
    rng: random.Random,
    *,
    h0_share: float = CHESS_H0_SHARE,
    notes_share: float = CHESS_NOTES_SHARE,
) -> Style:
    """A chess harness: h0 itself, or a random combination of the chess surfaces.

    `notes_share` is the chance that a layout in NOTE_LAYOUTS also names what each move does. It
    spreads the information a stronger harness can show over several layouts instead of one,
    without drawing any layout more often; the coin is only tossed when it is above 0, so a
    recipe at 0 draws exactly the transcripts it drew before the surface existed."""
    if rng.random() < h0_share:
        return Style(
            "chess",
            "h0",
            h0_source("chess"),
            {
                "move": ("<move>", "</move>"),
                "layout": "raw",
                "max_turns": 9,
                "format_budget": 1,
                "illegal_budget": 1,
            },
        )
    mo, mc = _pick(rng, CHESS_MOVES)
    fmt = {"mo": mo, "mc": mc}
    layout = _pick(rng, CHESS_LAYOUTS)
    notes = layout == "annotated"
    if notes_share > 0 and layout in NOTE_LAYOUTS:
        notes = rng.random() < notes_share
    user = _pick(rng, CHESS_USER).format(**fmt)
    values = {
        "SYSTEM_PROMPT": _pick(rng, CHESS_SYSTEM).format(**fmt),
        "USER_PROMPT": user,
        "MAX_TURNS": _pick(rng, [(9, 3.0), (6, 1.0), (12, 1.0)]),
        "FORMAT_RETRY_BUDGET": _pick(rng, [(1, 3.0), (2, 1.0), (0, 1.0)]),
        "ILLEGAL_MOVE_RETRY_BUDGET": _pick(rng, [(1, 3.0), (2, 1.0), (0, 1.0)]),
        "LAYOUT": layout,
        "SHOW_BOARD": rng.random() < 0.5,
        "MOVE_OPEN": mo,
        "MOVE_CLOSE": mc,
        "FEEDBACK": _pick(rng, FEEDBACKS),
        "NOTES": notes,
    }
    source = '"""A chess harness style used in pre-training."""\n\n' + _constants(values)
    source += "\n" + CHESS_BODY
    params = {
        "move": (mo, mc),
        "layout": layout,
        "notes": notes,
        "max_turns": values["MAX_TURNS"],
        "format_budget": values["FORMAT_RETRY_BUDGET"],
        "illegal_budget": values["ILLEGAL_MOVE_RETRY_BUDGET"],
    }
    name = f"chess-{layout}" + ("+notes" if notes and layout != "annotated" else "")
    return Style("chess", name, source, params)


# Appended to a variant's source: the legal-move lines reordered before any layout renders them.
# Pre-training always lists the moves in the verifier's order, so this measures whether the model
# reads the list by what each move does or by where it stands.
FORCING_FIRST = r"""

_render = format_observation


def _forcing_rank(line):
    san = line.split("SAN=", 1)[1].strip()
    if san.endswith("#"):
        return 0
    if san.endswith("+"):
        return 1
    return 2 if "x" in san else 3


def format_observation(observation, **context):
    lines = str(observation).splitlines()
    spots = [i for i, line in enumerate(lines) if _MOVE.match(line)]
    ordered = sorted((lines[i] for i in spots), key=_forcing_rank)
    for i, line in zip(spots, ordered):
        lines[i] = line
    return _render("\n".join(lines), **context)
"""


# Appended to a variant's source: every retry starts from the clean position. The feedback on a
# rejected reply is marked, and select_context leaves it out together with the reply, so the model
# samples the move again as on the first try instead of reading its own mistake.
CLEAN_RETRIES = r"""

_REJECTED = "Rejected: "


def format_feedback(kind, detail, **context):
    return _REJECTED + FEEDBACK.format(detail=detail)


def select_context(messages, **context):
    kept = []
    for message in messages:
        if message.get("role") == "user" and str(message.get("content", "")).startswith(_REJECTED):
            if kept and kept[-1].get("role") == "assistant":
                kept.pop()
            continue
        kept.append(message)
    return kept
"""


def chess_variant(
    layout: str = "raw",
    *,
    illegal_budget: int | None = None,
    show_board: bool = False,
    forcing_first: bool = False,
    clean_retries: bool = False,
    notes: bool = False,
) -> str:
    """Source of a chess harness that is h0 (its wording, `<move>` tags and limits) but for one
    thing: the legal-move layout, one of pre-training's `CHESS_LAYOUTS`, its illegal-move retry
    budget, (`forcing_first`) the order of its legal-move list: mates, checks, captures, then
    the rest, each group in the verifier's order, or (`clean_retries`) the context of a retry,
    which leaves out the rejected reply and the feedback on it, or (`notes`) a layout in
    `NOTE_LAYOUTS` that also names what each move does. `micro calibrate --chess-variants`
    scores these against h0, to tell whether the model reads any layout it was taught better than
    h0's, before a stronger harness is built on one."""
    layouts = [name for name, _ in CHESS_LAYOUTS]
    if layout not in layouts:
        raise ValueError(f"unknown chess layout {layout!r}; the layouts are {', '.join(layouts)}")
    budget = (
        h0_constant("chess", "ILLEGAL_MOVE_RETRY_BUDGET")
        if illegal_budget is None
        else illegal_budget
    )
    if budget < 0:
        raise ValueError(f"illegal_budget must be >= 0, got {budget}")
    if notes and layout not in NOTE_LAYOUTS:
        raise ValueError(f"only the {', '.join(NOTE_LAYOUTS)} layouts take notes, got {layout!r}")
    values = {
        "SYSTEM_PROMPT": h0_constant("chess", "SYSTEM_PROMPT"),
        "USER_PROMPT": h0_constant("chess", "USER_PROMPT"),
        "MAX_TURNS": h0_constant("chess", "MAX_TURNS"),
        "FORMAT_RETRY_BUDGET": h0_constant("chess", "FORMAT_RETRY_BUDGET"),
        "ILLEGAL_MOVE_RETRY_BUDGET": budget,
        "LAYOUT": layout,
        "SHOW_BOARD": show_board,
        "MOVE_OPEN": "<move>",
        "MOVE_CLOSE": "</move>",
        "FEEDBACK": "{detail}",
        "NOTES": notes or layout == "annotated",
    }
    noted = " with move notes" if notes else ""
    order = ", forcing moves listed first" if forcing_first else ""
    clean = ", each retry from the clean position" if clean_retries else ""
    doc = (
        f'"""Chess h0 with the {layout} layout{noted} and {budget} illegal-move retries{order}{clean} '
        '(calibration)."""\n\n'
    )
    source = _constants(values) + "\n" + CHESS_BODY
    source += FORCING_FIRST if forcing_first else ""
    source += CLEAN_RETRIES if clean_retries else ""
    return doc + source


STYLE_MAKERS = {"math": math_style, "search": search_style, "chess": chess_style}


# ====================================================================== held out

#: One format per surface the model reads that pre-training never draws (none of them is in the
#: lists above), for calibration on formats the model was not taught: the prompt's wording, the
#: system prompt, the passage layout, the observation's wrapper and the feedback message. The
#: action tags the model writes are h0's: the micro model cannot write a tag it never saw
#: (`micro calibrate --held-out` with held-out tags scored 0.0 under both search harnesses), so
#: holding them out would measure nothing but that. Chess keeps its trained formats for now.
HELD_OUT: dict[str, dict[str, Any]] = {
    "search": {
        "tags": ("<search>", "</search>", "<answer>", "</answer>"),
        "user": "Look up what you need with {so}terms{sc}, then reply {ao}answer{ac}.\n"
        "Question: {{question}}",
        "system": "This world is made up and unknown to you: look it up with {so}terms{sc} "
        "before you answer, and reply {ao}answer{ac} in words taken from the results.",
        "passage": "* {title} -- {text}",
        "wrap": "<docs>\n{body}\n</docs>",
        "feedback": "Not understood ({detail}). Reply again.",
    },
    "math": {
        "call": ("<python>\n", "\n</python>"),
        "answer": ("\\boxed{", "}"),
        "user": "{{question}}\nRun Python inside {co}...{cc} if it helps; put the number in "
        "{ao}...{ac}.",
        "system": "Work the number out with Python ({co}code{cc}; you see what it prints) and "
        "reply {ao}number{ac}.",
        "feedback": "Not understood ({detail}). Reply again.",
    },
}


def held_out_harness(domain: str, *, strong: bool) -> str:
    """h0 (or, `strong`, the stronger calibration harness) with every format swapped for the
    held-out one and every limit kept: one passage cut as h0 cuts it and two turns, or three whole
    passages, four turns and a system prompt (search); two turns and h0's view, or four turns, a
    plain output view, two format retries and a system prompt (math)."""
    if domain not in HELD_OUT:
        raise ValueError(f"no held-out formats for {domain!r}; they exist for {sorted(HELD_OUT)}")
    ho = HELD_OUT[domain]
    if domain == "search":
        so, sc, ao, ac = ho["tags"]
        fmt = {"so": so, "sc": sc, "ao": ao, "ac": ac}
        values: dict[str, Any] = {
            "SYSTEM_PROMPT": ho["system"].format(**fmt) if strong else "",
            "USER_PROMPT": ho["user"].format(**fmt),
            "MAX_TURNS": 4 if strong else h0_constant("search", "MAX_TURNS"),
            "FORMAT_RETRY_BUDGET": 1,
            "TOPK": 3 if strong else 1,
            "SHOWN_PASSAGES": 3 if strong else 1,
            "SHOWN_WORDS": 0 if strong else h0_constant("search", "SHOWN_WORDS"),
            "PASSAGE_FORMAT": ho["passage"],
            "PASSAGE_JOIN": "\n",
            "OBS_WRAP": ho["wrap"],
            "NO_RESULTS": "No results.",
            "SEARCH_OPEN": so,
            "SEARCH_CLOSE": sc,
            "ANSWER_OPEN": ao,
            "ANSWER_CLOSE": ac,
            "FEEDBACK": ho["feedback"],
        }
        body = SEARCH_BODY
    else:
        (co, cc), (ao, ac) = ho["call"], ho["answer"]
        fmt = {"co": co.strip(), "cc": cc.strip(), "ao": ao, "ac": ac}
        values = {
            "SYSTEM_PROMPT": ho["system"].format(**fmt) if strong else "",
            "USER_PROMPT": ho["user"].format(**fmt),
            "MAX_TURNS": 4 if strong else h0_constant("math", "MAX_TURNS"),
            "FORMAT_RETRY_BUDGET": 2 if strong else 1,
            "OBS_LAYOUT": "output" if strong else "readable",
            "OUTPUT_CHARS": 0,
            "CODE_OPEN": co,
            "CODE_CLOSE": cc,
            "ANSWER_OPEN": ao,
            "ANSWER_CLOSE": ac,
            "FEEDBACK": ho["feedback"],
        }
        body = MATH_BODY
    kind = "stronger calibration harness" if strong else "base harness h0"
    doc = f'"""The {kind} in formats pre-training never used (calibration)."""\n\n'
    return doc + _constants(values) + "\n" + body


def sample_style(
    domain: str,
    rng: random.Random,
    *,
    h0_share: float | None = None,
    notes_share: float | None = None,
) -> Style:
    """A random harness style for `domain`: h0 whole with chance `h0_share` (None: the domain's
    documented share), else a random combination of its surfaces; `notes_share` is chess's
    (`chess_style`; None: the documented `CHESS_NOTES_SHARE`)."""
    try:
        maker = STYLE_MAKERS[domain]
    except KeyError:
        known = ", ".join(STYLE_MAKERS)
        raise ValueError(f"unknown domain {domain!r}; expected one of {known}") from None
    if h0_share is not None and not 0.0 <= h0_share <= 1.0:
        raise ValueError(f"h0_share must be in 0..1, got {h0_share}")
    if notes_share is not None and not 0.0 <= notes_share <= 1.0:
        raise ValueError(f"notes_share must be in 0..1, got {notes_share}")
    if notes_share and domain != "chess":
        raise ValueError(f"notes_share is a chess surface; {domain} has no legal-move list")
    if domain == "chess":
        return chess_style(
            rng,
            h0_share=CHESS_H0_SHARE if h0_share is None else h0_share,
            notes_share=CHESS_NOTES_SHARE if notes_share is None else notes_share,
        )
    if h0_share is None:
        return maker(rng)
    return maker(rng, h0_share=h0_share)
