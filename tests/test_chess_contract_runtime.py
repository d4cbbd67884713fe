"""The WHALE chess contract at run time: the harness may present and parse, never choose a move.

A parsed move must be one the model's reply names (UCI or SAN, any case); anything else is a
format failure recorded as `harness_chose_move`, enforced engine side on the raw reply. Validation
also runs the parser on replies that name no move and flags one that answers anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chess
import pytest

from whale_lab.backends.base import Generation, SamplingParams
from whale_lab.config import SandboxConfig
from whale_lab.domains.base import SPLITS, Action, Task
from whale_lab.domains.chess import HARNESS_CHOSE_MOVE, ChessDomain, ChessEnv, moves_named
from whale_lab.domains.chess_puzzles import load_builtin_puzzles, puzzle_kind
from whale_lab.harness import HarnessHost, validate_harness
from whale_lab.rollout import run_episodes

REPO = Path(__file__).resolve().parent.parent
SHIPPED = sorted((REPO / "harnesses" / "chess").glob("*.py"))
CONTRACT = REPO / "tests" / "fixtures" / "whale_chess_contract_harness.py"
SANDBOX = SandboxConfig(call_timeout_s=2.0, memory_mb=512)
NO_MOVE = ("I am not sure.", "", "Let me think about the position")

# parse_action ignores the reply: it plays the listed mate (else a capture) of the board it showed.
CHOOSER = '''"""Hostile: parse_action plays the listed mate in one (else a capture), whatever the reply."""

import re

USER_PROMPT = "{observation}\\nAnswer with one move as <move>uci</move>."
FORMAT_RETRY_BUDGET = 2
ILLEGAL_MOVE_RETRY_BUDGET = 1
MAX_TURNS = 5
_LINE = re.compile(r"^- \\[([a-h][1-8][a-h][1-8][qrbn]?)\\] SAN=(\\S+)", re.MULTILINE)
_SHOWN = {}


def format_observation(observation, **context):
    _SHOWN["board"] = str(observation)
    return str(observation)


def parse_action(response, **context):
    moves = _LINE.findall(_SHOWN.get("board", ""))
    for uci, san in moves:
        if san.endswith("#"):
            return uci
    for uci, san in moves:
        if "x" in san:
            return uci
    return "__no_move__"


def propose_action(board):
    return ""


def is_legal_action(board, action):
    return isinstance(action, str) and ("[" + action.strip().lower() + "]") in str(board)
'''

# An honest parser that reads SAN: it looks the model's SAN up in the legal moves it showed.
SAN_READER = '''"""Reads one SAN or UCI move from the reply and maps it to UCI with the listed legal moves."""

import re

USER_PROMPT = "{observation}\\nAnswer with one move in SAN."
_LINE = re.compile(r"^- \\[([a-h][1-8][a-h][1-8][qrbn]?)\\] SAN=(\\S+)", re.MULTILINE)
_SHOWN = {}


def format_observation(observation, **context):
    _SHOWN["board"] = str(observation)
    return str(observation)


def parse_action(response, **context):
    listed = _LINE.findall(_SHOWN.get("board", ""))
    words = re.findall(r"[A-Za-z0-9=+#-]+", str(response))
    for word in words:
        for uci, san in listed:
            if word == san or word.rstrip("+#") == san.rstrip("+#") or word.lower() == uci:
                return uci
    return "__no_move__"


def propose_action(board):
    return ""


def is_legal_action(board, action):
    return isinstance(action, str) and ("[" + action.strip().lower() + "]") in str(board)
'''


class _Scripted:
    """A stand-in model: the same replies in turn, for every episode."""

    name = "scripted"

    def __init__(self, replies: tuple[str, ...]) -> None:
        self.replies = replies
        self.calls = 0

    def generate(self, prompts: list[Any], params: Any) -> list[Generation]:
        out = []
        for _ in prompts:
            text = self.replies[self.calls % len(self.replies)]
            self.calls += 1
            out.append(Generation(text=text, prompt_tokens=1, completion_tokens=1,
                                  finish_reason="stop"))
        return out

    def count_tokens(self, messages: list[Any]) -> int:
        return 1

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def puzzles() -> tuple[ChessDomain, list[Task]]:
    """Two mates in one and two hanging pieces from the shipped set: what a chooser would solve."""
    by_kind: dict[str, list[Any]] = {}
    for p in load_builtin_puzzles():
        by_kind.setdefault(puzzle_kind(p), []).append(p)
    chosen = by_kind["mateIn1"][:2] + by_kind["hangingPiece"][:2]
    dom = ChessDomain(chosen, seed=0, sizes=dict.fromkeys(SPLITS, 1))
    tasks = sorted((t for s in SPLITS for t in dom.tasks(s)), key=lambda t: t.id)
    return dom, tasks


@pytest.fixture()
def chooser(tmp_path: Path) -> Path:
    path = tmp_path / "chooser.py"
    path.write_text(CHOOSER, encoding="utf-8")
    return path


def _episodes(
    dom: ChessDomain, tasks: list[Task], harness: Path, replies: tuple[str, ...]
) -> Iterator[Any]:
    """One episode per task, one at a time (a remembering harness keeps one board)."""
    with HarnessHost(harness, "chess", SANDBOX) as host:
        for task in tasks:
            (trace,) = run_episodes(
                [(task, 0)], dom, host, _Scripted(replies), SamplingParams(max_new_tokens=16)
            )
            yield trace


# ------------------------------------------------------------------ which moves a reply names


@pytest.mark.parametrize(
    ("fen", "reply", "named"),
    [
        (chess.STARTING_FEN, "e2e4", {"e2e4"}),
        (chess.STARTING_FEN, "I play E2E4.", {"e2e4"}),
        (chess.STARTING_FEN, "1. e4", {"e2e4"}),
        (chess.STARTING_FEN, "<move>Nf3</move>", {"g1f3"}),
        (chess.STARTING_FEN, "nf3!", {"g1f3"}),
        (chess.STARTING_FEN, "Ng1-f3", {"g1f3"}),
        (chess.STARTING_FEN, "e2-e5", {"e2e5"}),  # named, if illegal: the env says why
        ("rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2", "exd5", {"e4d5"}),
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "O-O", {"e1g1"}),
        ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "0-0-0", {"e1c1"}),
        ("6k1/P4ppp/8/8/8/8/5PPP/6K1 w - - 0 1", "e7e8q or a8=Q#", {"e7e8q", "a7a8q"}),
        ("6k1/P4ppp/8/8/8/8/5PPP/6K1 w - - 0 1", "a7a8", {"a7a8"}),  # not the promotion
        ("4k3/8/8/8/8/2p5/1P1B4/4K3 w - - 0 1", "Bxc3", {"d2c3"}),  # exact case wins
        ("4k3/8/8/8/8/2p5/1P1B4/4K3 w - - 0 1", "bxc3", {"b2c3"}),
        ("4k3/8/8/8/8/2p5/1P1B4/4K3 w - - 0 1", "BXC3", {"b2c3", "d2c3"}),
        *[(chess.STARTING_FEN, reply, set()) for reply in NO_MOVE],
    ],
)
def test_moves_named_reads_uci_and_san_in_any_case(fen: str, reply: str, named: set[str]) -> None:
    assert moves_named(chess.Board(fen), reply) == named


def test_check_reply_refuses_a_move_the_reply_does_not_name() -> None:
    env = ChessEnv("6k1/5ppp/8/8/8/8/5PPP/R5K1 b - - 0 1", ["h7h6", "a1a8"])
    move = Action(kind="move", value="a1a8")
    assert env.check_reply(move, "Ra8#, back rank") is None
    assert env.check_reply(move, "<move>A1A8</move>") is None
    assert env.check_reply(Action(kind="answer", value="x"), "") is None
    refused = env.check_reply(move, "I am not sure.")
    assert refused is not None
    kind, reason, shown = refused
    assert kind == HARNESS_CHOSE_MOVE == "harness_chose_move"
    assert "parse_action returned 'a1a8'" in reason and "'I am not sure.'" in reason
    assert "a1a8" not in shown  # the model is not told the parser's choice


# ------------------------------------------------------------------ at run time


def test_a_harness_that_chooses_the_move_solves_nothing(
    puzzles: tuple[ChessDomain, list[Task]], chooser: Path
) -> None:
    dom, tasks = puzzles
    # the attack is real: played unchecked, its pick (the first listed mate, else the first
    # listed capture) solves the mates in one at least
    solved = 0
    for task in tasks:
        env = dom.make_env(task)
        board = env.board
        listed = sorted(board.legal_moves, key=lambda m: m.uci())
        mates = [m for m in listed if board.san(m).endswith("#")]
        pick = (mates or [m for m in listed if board.is_capture(m)])[0]
        solved += env.step(Action(kind="move", value=pick.uci())).stop_reason == "solved"
    assert solved >= 2

    traces = list(_episodes(dom, tasks, chooser, NO_MOVE))
    assert [t.reward for t in traces] == [0.0] * 4
    assert {t.stop_reason for t in traces} == {"format_failure"}
    for t in traces:
        assert t.format_failures == 3 and t.n_turns == 3  # FORMAT_RETRY_BUDGET 2, then out
        for turn in t.turns:
            assert turn.feedback is not None and turn.feedback["kind"] == HARNESS_CHOSE_MOVE
            assert "the harness chose the move" in turn.feedback["detail"]
            assert turn.action is not None and turn.action["kind"] == "invalid"
            assert turn.action["value"]  # the move it tried is in the trace
        # what the model was told is the plain no-move feedback, not the chosen move
        told = [m["content"] for m in t.turns[-1].prompt[1:] if m["role"] == "user"]
        assert told and all(text.startswith("no move found in the reply") for text in told)
        assert not any(t.turns[0].action["value"] in text for text in told)


def test_a_reply_that_names_the_move_is_still_the_models(
    puzzles: tuple[ChessDomain, list[Task]], chooser: Path
) -> None:
    """The rule is about who chose: the same parser's move stands when the reply names it."""
    dom, tasks = puzzles
    for task in tasks:
        board = dom.make_env(task).board
        mate = [m for m in board.legal_moves if board.san(m).endswith("#")]
        if not mate:
            continue
        (trace,) = _episodes(dom, [task], chooser, (f"Mate: {board.san(mate[0])}",))
        assert trace.stop_reason == "solved" and trace.reward == 1.0


def test_an_honest_san_parser_and_the_shipped_harnesses_are_not_refused(
    puzzles: tuple[ChessDomain, list[Task]], tmp_path: Path
) -> None:
    dom, tasks = puzzles
    reader = tmp_path / "san_reader.py"
    reader.write_text(SAN_READER, encoding="utf-8")
    for task in tasks:
        env = dom.make_env(task)
        solution = chess.Move.from_uci(task.answer["moves"][1])
        san, uci = env.board.san(solution), solution.uci()
        (trace,) = _episodes(dom, [task], reader, (f"I play {san}",))
        assert trace.stop_reason == "solved", (task.id, san, trace.turns[0].feedback)
        for harness in SHIPPED:
            (trace,) = _episodes(dom, [task], harness, (f"<move>{uci.upper()}</move>",))
            assert trace.stop_reason == "solved", (harness.name, task.id)


# ------------------------------------------------------------------ at validation


def test_validation_flags_a_parser_that_answers_replies_naming_no_move(
    puzzles: tuple[ChessDomain, list[Task]], chooser: Path
) -> None:
    dom, _ = puzzles
    for domain in (dom, "chess"):  # with the domain's own boards, and with the documented layout
        result = validate_harness(chooser, domain, SANDBOX)
        assert not result.ok
        flagged = [p for p in result.problems if "for a reply that names no move" in p]
        assert flagged, result.problems
        assert "the harness may parse the model's move, never choose one" in flagged[0]


@pytest.mark.parametrize("path", [*SHIPPED, CONTRACT], ids=lambda p: p.stem)
def test_shipped_chess_harnesses_still_validate(
    path: Path, puzzles: tuple[ChessDomain, list[Task]]
) -> None:
    dom, _ = puzzles
    for domain in (dom, "chess"):
        result = validate_harness(path, domain, SANDBOX)
        assert result.ok, result.problems
