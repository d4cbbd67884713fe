"""The chess puzzle domain: loader, generator, environment rules, splits and contract harnesses."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import chess
import pytest

from whale_lab.config import config_from_dict
from whale_lab.domains.base import SPLITS, Action
from whale_lab.domains.chess import ChessDomain, ChessEnv, explain_illegal
from whale_lab.domains.chess_puzzles import (
    BUILTIN_COUNT,
    BUILTIN_PATH,
    BUILTIN_SEED,
    KINDS,
    MIN_GAIN,
    Puzzle,
    generate_puzzles,
    load_builtin_puzzles,
    material,
    mating_moves,
    puzzle_kind,
    verify_puzzle,
    winning_moves,
)
from whale_lab.domains.errors import DataError
from whale_lab.domains.lichess import load_lichess_csv

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO.parent / "shared" / "data" / "lichess_sample.csv"
H0 = REPO / "harnesses" / "chess" / "h0.py"
CONTRACT = REPO / "tests" / "fixtures" / "whale_chess_contract_harness.py"
WHALE_IMPORTS = {"__future__", "collections", "itertools", "math", "random", "re", "statistics"}
HEADER = "PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags"

# Hand-built lines (FEN before the trigger, then trigger + solution).
TWO_MATES = ("7k/6pp/2p5/8/8/8/8/RR4K1 b - - 0 30", ["c6c5", "a1a8"])  # Ra8# and Rb8# both mate
PROMOTION = ("k7/4P3/8/8/8/8/7r/4K3 b - - 0 50", ["h2h3", "e7e8q", "a8a7", "e8e3"])
CASTLING = ("4k3/8/8/8/8/8/8/4K2R b K - 0 40", ["e8d8", "e1g1", "d8c8", "f1f8"])


@pytest.fixture(scope="module")
def sample() -> list[Puzzle]:
    if not SAMPLE.exists():
        pytest.skip(f"{SAMPLE} not present")
    return load_lichess_csv(SAMPLE)


@pytest.fixture(scope="module")
def domain() -> ChessDomain:
    cfg = config_from_dict(
        {
            "run": {"seed": 3},
            "domain": {
                "name": "chess",
                "splits": {"weight": 100, "harness": 20, "val": 20, "test": 20},
            },
        }
    )
    return ChessDomain.from_config(cfg)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"harness_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _move(text: str) -> Action:
    return Action(kind="move", value=text)


def _write_csv(tmp_path: Path, *rows: str, header: str = HEADER) -> Path:
    path = tmp_path / "puzzles.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------ Lichess rows


def test_lichess_sample_rows_replay_and_solve(sample: list[Puzzle]) -> None:
    assert len(sample) == 11
    by_id = {p.id: p for p in sample}
    assert by_id["00008"].rating == 1797 and by_id["00008"].extra["nb_plays"] == 10183
    assert "hangingPiece" in by_id["00008"].themes
    assert by_id["0009B"].extra["popularity"] is None  # empty optional columns are fine
    assert by_id["000hf"].trigger == "e1g1"  # the trigger itself castles
    for p in sample:
        env = ChessEnv(p.fen, p.moves, task_id=p.id)
        assert env.context()["last_opponent_move"] == p.trigger
        for i, move in enumerate(p.solver_moves):
            assert env.context()["turn_count"] == i
            out = env.step(_move(move))
        assert (out.done, out.reward, out.stop_reason) == (True, 1.0, "solved")
        info = env.final_info()
        assert info["solved_plies"] == info["line_length"] == len(p.moves) - 1
        assert info["illegal_attempts"] == 0


def test_opponent_reply_is_applied_after_each_correct_move(sample: list[Puzzle]) -> None:
    p = next(p for p in sample if p.id == "00008")  # f2g3 e6e7 b2b1 b3c1 b1c1 h6c1
    env = ChessEnv(p.fen, p.moves)
    out = env.step(_move("e6e7"))
    assert not out.done and out.feedback_kind is None
    assert env.context() == {"turn_count": 1, "side_to_move": "white", "last_opponent_move": "b2b1"}
    assert "Opponent's last move: b2b1 (SAN Qb1+)" in out.observation
    assert "Your moves accepted so far: e6e7" in out.observation
    out = env.step(_move("b3c1"))
    assert env.context()["last_opponent_move"] == "b1c1"
    assert env.step(_move("h6c1")).stop_reason == "solved"


def test_wrong_legal_move_ends_the_episode(sample: list[Puzzle]) -> None:
    p = next(p for p in sample if p.id == "0000D")  # d3d6 f8d8 d6d8 f6d8
    env = ChessEnv(p.fen, p.moves)
    out = env.step(_move("g8h8"))
    assert (out.done, out.reward, out.stop_reason) == (True, 0.0, "wrong_move")
    assert env.final_info()["solved_plies"] == 0
    with pytest.raises(RuntimeError):
        env.step(_move("f8d8"))
    # a wrong move later in the line also ends it, after credit for what was played
    env = ChessEnv(p.fen, p.moves)
    env.step(_move("f8d8"))
    out = env.step(_move("b6d8"))  # Qxd8 is legal but not the line's Bxd8 (and not mate)
    assert out.stop_reason == "wrong_move"
    info = env.final_info()
    assert (info["solved_plies"], info["line_length"], info["legal_moves"]) == (2, 3, 2)


def test_illegal_move_gives_verifier_feedback(sample: list[Puzzle]) -> None:
    p = next(p for p in sample if p.id == "00008")
    env = ChessEnv(p.fen, p.moves)
    cases = {
        "a1a2": "no piece on a1",
        "h8g8": "black's; you play white",
        "e6e5x": "not a UCI move",
        "e6d7": "cannot move to d7",
        "h1g1": "",  # legal king move: checked below as wrong, not here
    }
    for move, why in cases.items():
        if not why:
            continue
        out = env.step(_move(move))
        assert not out.done and out.feedback_kind == "illegal"
        assert f"Illegal move {move}" in out.feedback_detail and why in out.feedback_detail
    assert env.final_info()["illegal_attempts"] == 4
    # a pinned piece and a move into check are explained too
    board = chess.Board("4r1k1/8/8/8/8/8/4N3/4K3 w - - 0 1")
    assert "leave your king in check" in explain_illegal(board, "e2c3")
    board = chess.Board("4r1k1/8/8/8/8/8/8/4K3 w - - 0 1")
    assert "does not end the check" in explain_illegal(board, "e1e2")
    # the episode goes on after illegal attempts
    assert env.step(_move("e6e7")).observation is not None


def test_final_move_accepts_any_mate() -> None:
    fen, moves = TWO_MATES
    env = ChessEnv(fen, moves)
    out = env.step(_move("b1b8"))  # not the stored move, but mate on the final move
    assert (out.reward, out.stop_reason) == (1.0, "solved")
    env = ChessEnv(fen, moves)
    assert env.step(_move("a1a8")).stop_reason == "solved"
    env = ChessEnv(fen, moves)
    assert env.step(_move("a1a5")).stop_reason == "wrong_move"  # legal, not mate
    # before the final move an alternative is wrong even when it wins
    env = ChessEnv(PROMOTION[0], PROMOTION[1])
    assert env.step(_move("e7e8r")).stop_reason == "wrong_move"


def test_promotion_line() -> None:
    env = ChessEnv(*PROMOTION)
    obs = env.initial_observation()
    assert "- [e7e8q] SAN=e8=Q+" in obs and "- [e7e8n] SAN=e8=N" in obs
    out = env.step(_move("e7e8"))
    assert out.feedback_kind == "illegal" and "must promote" in out.feedback_detail
    out = env.step(Action(kind="move", value=" E7E8Q "))  # case and whitespace are normalised
    assert out.observation is not None and env.context()["last_opponent_move"] == "a8a7"
    assert "Your moves accepted so far: e7e8q" in out.observation
    assert env.step(_move("e8e3")).stop_reason == "solved"


def test_castling_line() -> None:
    env = ChessEnv(*CASTLING)
    assert "- [e1g1] SAN=O-O" in env.initial_observation()
    out = env.step(_move("e1h1"))
    assert out.feedback_kind == "illegal" and "king's two-square move" in out.feedback_detail
    out = env.step(_move("e1g1"))
    assert out.observation is not None and env.board.piece_at(chess.F1) is not None
    assert env.step(_move("f1f8")).stop_reason == "solved"
    # without the castling right the same move is explained, not accepted
    board = chess.Board("4k3/8/8/8/8/8/8/4K2R w - - 0 1")
    assert "castling is not allowed" in explain_illegal(board, "e1g1")


# ------------------------------------------------------------------ loader errors


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ("bad01,not a fen,e2e4 e7e5,1500,,,,,,", "bad FEN"),
        ("bad02,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e9,1500,,,,,,", "not a UCI move"),
        ("bad03,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e6,1500,,,,,,", "illegal"),
        ("bad04,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2,1500,,,,,,", "at least one solver move"),
        ("bad05,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e7,high,,,,,,", "Rating must be an integer"),
        ("bad06,4k3/8/8/8/8/8/8/4K3 w - - 0 1,,1500,,,,,,", "empty Moves"),
        ("bad07,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e7,1,2,3,4,t,u,o,extra", "columns"),
        ("bad08,4k3/8/8/8/8/8/8/K3k3 w - - 0 1,a1a2 e8e7,1500,,,,,,", "not a legal position"),
    ],
)
def test_loader_names_file_line_and_problem(tmp_path: Path, row: str, problem: str) -> None:
    good = "ok001,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e7,1500,,,,,,"
    path = _write_csv(tmp_path, good, row)
    with pytest.raises(DataError) as err:
        load_lichess_csv(path)
    message = str(err.value)
    assert f"{path}:3" in message and problem in message, message


def test_loader_header_duplicates_and_missing(tmp_path: Path) -> None:
    row = "ok001,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e7"
    path = _write_csv(tmp_path, row, header="PuzzleId,Position,Moves")
    with pytest.raises(DataError, match=r"puzzles\.csv:1: header lacks column\(s\) FEN"):
        load_lichess_csv(path)
    path = _write_csv(tmp_path, row, row, header="PuzzleId,FEN,Moves")
    with pytest.raises(DataError, match=r":3: duplicate PuzzleId 'ok001' \(first on line 2\)"):
        load_lichess_csv(path)
    # only the three required columns, and no header at all, both read
    assert (
        load_lichess_csv(_write_csv(tmp_path, row, header="PuzzleId,FEN,Moves"))[0].rating is None
    )
    no_header = tmp_path / "bare.csv"
    no_header.write_text(row + ",1200\n", encoding="utf-8")
    assert load_lichess_csv(no_header)[0].rating == 1200
    with pytest.raises(DataError, match="file not found"):
        load_lichess_csv(tmp_path / "missing.csv")
    zst = tmp_path / "lichess_db_puzzle.csv.zst"
    zst.write_bytes(b"\x28\xb5\x2f\xfd")
    with pytest.raises(DataError, match="decompress it first"):
        load_lichess_csv(zst)


def test_domain_from_missing_or_bad_source(tmp_path: Path) -> None:
    cfg = config_from_dict({"domain": {"name": "chess", "source": str(tmp_path / "nope.csv")}})
    with pytest.raises(DataError, match="domain.source: .*nope.csv: file not found"):
        ChessDomain.from_config(cfg)
    bad = _write_csv(tmp_path, "x1,4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e6,1500,,,,,,")
    cfg = config_from_dict({"domain": {"name": "chess", "source": str(bad)}})
    with pytest.raises(DataError, match=r"puzzles\.csv:2: puzzle x1: move 2 \(solver\) e8e6"):
        ChessDomain.from_config(cfg)


def test_other_sources_gzip_jsonl_and_lazy_replay(
    tmp_path: Path, sample: list[Puzzle], monkeypatch: pytest.MonkeyPatch
) -> None:
    import gzip

    import whale_lab.domains.chess as chess_domain
    from whale_lab.domains.chess_puzzles import write_puzzles_jsonl

    gz = tmp_path / "puzzles.csv.gz"
    gz.write_bytes(gzip.compress(SAMPLE.read_bytes()))
    assert [p.moves for p in load_lichess_csv(gz)] == [p.moves for p in sample]
    jsonl = tmp_path / "mine.jsonl"
    write_puzzles_jsonl(sample[:6], jsonl)
    cfg = config_from_dict(
        {
            "domain": {
                "name": "chess",
                "source": str(jsonl),
                "splits": {"weight": 3, "harness": 1, "val": 1, "test": 1},
            }
        }
    )
    dom = ChessDomain.from_config(cfg)
    assert sorted(t.id for s in SPLITS for t in dom.tasks(s)) == sorted(p.id for p in sample[:6])
    # a big file is indexed cheaply and only the rows the splits use are replayed
    monkeypatch.setattr(chess_domain, "_FULL_SCAN_LIMIT", 3)
    cfg = config_from_dict(
        {
            "domain": {
                "name": "chess",
                "source": str(SAMPLE),
                "splits": {"weight": 2, "harness": 1, "val": 1, "test": 1},
            }
        }
    )
    dom = ChessDomain.from_config(cfg)
    assert any("only the rows used in the splits were replayed" in n for n in dom.notes)
    bad = _write_csv(tmp_path, *[f"b{i},4k3/8/8/8/8/8/8/4K3 w - - 0 1,e1e2 e8e6" for i in range(6)])
    cfg = config_from_dict({"domain": {"name": "chess", "source": str(bad)}})
    with pytest.raises(DataError, match=r"puzzles\.csv:\d: puzzle b\d: move 2 \(solver\) e8e6"):
        ChessDomain.from_config(cfg)


# ------------------------------------------------------------------ splits


def test_splits_are_disjoint_sized_and_seeded(domain: ChessDomain) -> None:
    ids = {s: [t.id for t in domain.tasks(s)] for s in SPLITS}
    assert {s: len(v) for s, v in ids.items()} == {
        "weight": 100,
        "harness": 20,
        "val": 20,
        "test": 20,
    }
    flat = [i for v in ids.values() for i in v]
    assert len(flat) == len(set(flat))
    assert domain.notes == []
    same = ChessDomain(
        load_builtin_puzzles(), seed=3, sizes={"weight": 7, "harness": 20, "val": 20, "test": 20}
    )
    assert [t.id for t in same.tasks("test")] == ids["test"]  # test does not move with weight
    other = ChessDomain(
        load_builtin_puzzles(), seed=4, sizes={"weight": 100, "harness": 20, "val": 20, "test": 20}
    )
    assert [t.id for t in other.tasks("test")] != ids["test"]
    task = domain.tasks("test")[0]
    assert set(task.fields) == {"question", "fen", "side_to_move"}  # no answer, id or themes
    assert task.answer["moves"][1] not in json.dumps(dict(task.fields))
    with pytest.raises(ValueError, match="unknown split"):
        domain.tasks("train")  # type: ignore[arg-type]


def test_too_few_puzzles_for_the_evaluation_splits_is_a_clear_error(sample: list[Puzzle]) -> None:
    # one rule for all three domains: test, val and harness are never shrunk (the `sample`
    # fixture skips where the shared Lichess sample is absent, as in a fresh clone)
    cfg = config_from_dict({"run": {"seed": 1}, "domain": {"name": "chess", "source": str(SAMPLE)}})
    with pytest.raises(DataError) as info:
        ChessDomain.from_config(cfg)
    message = str(info.value)
    assert "\n" not in message and "11 puzzles" in message
    assert "test, val and harness need 96" in message and "weight=512" in message


def test_weight_takes_what_is_left_with_a_warning(sample: list[Puzzle]) -> None:
    cfg = config_from_dict({
        "run": {"seed": 1},
        "domain": {"name": "chess", "source": str(SAMPLE),
                   "splits": {"test": 2, "val": 2, "harness": 2, "weight": 512}},
    })
    dom = ChessDomain.from_config(cfg)
    sizes = {s: len(dom.tasks(s)) for s in SPLITS}
    assert sizes == {"weight": 5, "harness": 2, "val": 2, "test": 2}
    assert dom.notes and "only 5 are left for weight, which asks for 512" in dom.notes[0]
    ids = [t.id for s in SPLITS for t in dom.tasks(s)]
    assert sorted(ids) == sorted(p.id for p in sample)
    env = dom.make_env(dom.tasks("test")[0])
    assert isinstance(env, ChessEnv)


# ------------------------------------------------------------------ generator


def test_shipped_set_is_small_balanced_and_reproducible() -> None:
    assert BUILTIN_PATH.stat().st_size < 1_000_000
    puzzles = load_builtin_puzzles()
    assert len(puzzles) == BUILTIN_COUNT
    assert len({p.id for p in puzzles}) == len(puzzles)
    kinds = [puzzle_kind(p) for p in puzzles]
    assert {k: kinds.count(k) for k in KINDS} == {k: BUILTIN_COUNT // 4 for k in KINDS}
    regenerated = generate_puzzles(4, seed=BUILTIN_SEED)
    assert [p.to_json() for p in regenerated] == [p.to_json() for p in puzzles[:4]]
    for p in regenerated:
        assert verify_puzzle(p) == [], p.id
    # a spread of the shipped file re-verifies too (the solution is the only one at each step)
    for p in puzzles[4::97]:
        assert verify_puzzle(p) == [], p.id
    assert generate_puzzles(2, seed=1) != generate_puzzles(2, seed=2)


def test_uniqueness_check_rejects_alternatives() -> None:
    fen, moves = TWO_MATES
    board = chess.Board(fen)
    board.push_uci(moves[0])
    assert sorted(m.uci() for m in mating_moves(board)) == ["a1a8", "b1b8"]
    two = Puzzle(id="t", fen=fen, moves=tuple(moves), themes=("mateIn1",))
    problems = verify_puzzle(two)
    assert problems and "only move that mates" in problems[0] and "b1b8" in problems[0]
    # two captures that each win the hanging queen: not a unique material puzzle
    hang = Puzzle(
        id="h",
        fen="4k3/8/8/3q4/8/2N1N3/8/4K3 b - - 0 1",
        moves=("e8d8", "c3d5"),
        themes=("hangingPiece",),
    )
    before = chess.Board(hang.fen)
    board = hang.start_board()
    wins = winning_moves(board, 1, material(before, chess.WHITE) + MIN_GAIN)
    assert sorted(m.uci() for m in wins) == ["c3d5", "e3d5"]
    assert any("only move that wins material" in p for p in verify_puzzle(hang))


# ------------------------------------------------------------------ observation and actions


def test_observation_text_format(sample: list[Puzzle]) -> None:
    p = next(p for p in sample if p.id == "00008")
    env = ChessEnv(p.fen, p.moves)
    obs = env.initial_observation()
    lines = obs.splitlines()
    assert lines[0] == "Side to move: White (you play White)"
    assert lines[1] == "FEN: r6k/pp2r2p/4Rp1Q/3p4/8/1N1P2b1/PqP3PP/7K w - - 0 25"
    assert lines[3] == "8 r . . . . . . k" and lines[10] == "1 . . . . . . . K"
    assert lines[11] == "  a b c d e f g h"
    assert "Opponent's last move: f2g3 (SAN Bxg3)" in lines
    assert "Your moves accepted so far: none" in lines
    start = lines.index("Legal moves (39):")
    legal = lines[start + 1 :]
    assert len(legal) == 39 and "- [h6h7] SAN=Qxh7+" in legal and "- [e6e7] SAN=Rxe7" in legal
    assert legal == sorted(legal)
    assert env.context() == {"turn_count": 0, "side_to_move": "white", "last_opponent_move": "f2g3"}
    black = next(p for p in sample if p.id == "0000D")
    assert ChessEnv(black.fen, black.moves).context()["side_to_move"] == "black"


def test_normalise_action(domain: ChessDomain) -> None:
    norm = domain.normalise_action
    assert norm("e2e4") == Action(kind="move", value="e2e4")
    assert norm("  E7E8Q\n") == Action(kind="move", value="e7e8q")
    assert norm("e2 e4").value == "e2e4"
    assert norm({"type": "move", "move": "G1F3"}) == Action(kind="move", value="g1f3")
    assert norm({"type": "answer", "content": "e1g1"}).value == "e1g1"
    for raw in (
        None,
        "",
        "   ",
        "__no_move__",
        "__ambiguous_multiple_moves__",
        "Nf3",
        "e2e9",
        "e2e4 e7e5",
        {"type": "tool", "name": "python", "arguments": {}},
        {"type": "invalid", "reason": "no tag"},
        {"type": "move"},
        {"kind": "x"},
        42,
        ["e2e4"],
    ):
        action = norm(raw)
        assert action.kind == "invalid" and action.reason, raw
    assert "more than one move" in norm("__ambiguous_multiple_moves__").reason
    assert norm({"type": "invalid", "reason": "no tag"}).reason == "no tag"


# ------------------------------------------------------------------ contract harnesses


@pytest.mark.parametrize("path", [H0, CONTRACT])
def test_harness_files_meet_the_whale_chess_contract(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= WHALE_IMPORTS, imported - WHALE_IMPORTS
    mod = _load(path)
    assert "{observation}" in mod.USER_PROMPT and isinstance(mod.SYSTEM_PROMPT, str)
    assert 0 <= mod.FORMAT_RETRY_BUDGET <= 10 and 0 <= mod.ILLEGAL_MOVE_RETRY_BUDGET <= 10
    assert 1 <= mod.MAX_TURNS <= 18
    assert mod.propose_action("anything") == ""
    if path == H0:
        assert (mod.FORMAT_RETRY_BUDGET, mod.ILLEGAL_MOVE_RETRY_BUDGET, mod.MAX_TURNS) == (1, 1, 9)


def test_h0_parses_only_the_move_tag() -> None:
    h0 = _load(H0)
    assert h0.parse_action("I play <move>E2E4</move>.") == "e2e4"
    assert h0.parse_action("<move> e7e8q </move> and again <move>e7e8q</move>") == "e7e8q"
    assert (
        h0.parse_action("<move>e2e4</move> or <move>d2d4</move>") == "__ambiguous_multiple_moves__"
    )
    assert h0.parse_action("e2e4") == "__no_move__"  # weak: no bare-token fallback
    assert h0.parse_action("") == "__no_move__"
    obs = "Legal moves (2):\n- [e2e4] SAN=e4\n- [e7e8q] SAN=e8=Q"
    assert (
        h0.format_observation(
            obs, turn_count=0, side_to_move="white", last_opponent_move="e7e5", max_turns=9
        )
        == obs
    )
    assert h0.is_legal_action(obs, "e2e4") and not h0.is_legal_action(obs, "d2d4")
    assert not h0.is_legal_action(obs, "__no_move__")


def test_contract_fixture_parses_and_annotates() -> None:
    mod = _load(CONTRACT)
    assert mod.parse_action("Maybe <move>a1a2</move>, no: <move>h6h7</move>") == "h6h7"
    assert mod.parse_action("The best move is h6h7.") == "h6h7"
    assert mod.parse_action("[b3c1]") == "b3c1"
    assert mod.parse_action("e6e7 or h6h7") == "__ambiguous_multiple_moves__"
    assert mod.parse_action("Queen takes h7") == "__no_move__"
    obs = "Legal moves (3):\n- [h6h7] SAN=Qxh7+\n- [e6e7] SAN=Rxe7\n- [a2a3] SAN=a3"
    shown = mod.format_observation(
        obs, turn_count=1, side_to_move="white", last_opponent_move="b2b1", max_turns=12
    )
    assert shown.startswith("[You play white. Solver move 2 (at most 12 replies).")
    assert "- [h6h7] SAN=Qxh7+  (capture, check)" in shown
    assert "- [a2a3] SAN=a3\n" in shown + "\n"


@pytest.mark.parametrize("path", [H0, CONTRACT])
def test_contract_harnesses_drive_the_env_on_real_puzzles(
    path: Path, sample: list[Puzzle], domain: ChessDomain
) -> None:
    mod = _load(path)
    for p in sample:
        env = ChessEnv(p.fen, p.moves, task_id=p.id)
        obs = env.initial_observation()
        for expected in p.solver_moves:
            shown = mod.format_observation(obs, **env.context(), max_turns=mod.MAX_TURNS)
            assert f"[{expected}]" in shown
            parsed = mod.parse_action(f"Looking at the board...\n<move>{expected.upper()}</move>")
            assert parsed == expected and mod.is_legal_action(obs, parsed)
            out = env.step(domain.normalise_action(parsed))
            obs = out.observation
        assert out.stop_reason == "solved", p.id
        # unparseable replies become invalid actions, never moves
        assert domain.normalise_action(mod.parse_action("I resign.")).kind == "invalid"


# ------------------------------------------------------------------ end to end


class _ReplayModel:
    """A stand-in for the model: replays fixed replies per puzzle, found by the FEN it is shown."""

    name = "replay"

    def __init__(self, replies: dict[str, list[str]]) -> None:
        self.replies = {k: list(v) for k, v in replies.items()}
        self.prompts: dict[str, list[list[dict[str, str]]]] = {}

    def generate(self, prompts: list, params: object) -> list:
        from whale_lab.backends.base import Generation

        out = []
        for msgs in prompts:
            first_user = next(m["content"] for m in msgs if m["role"] == "user")
            fen = next(line for line in first_user.splitlines() if line.startswith("FEN: "))
            self.prompts.setdefault(fen, []).append(list(msgs))
            text = self.replies[fen].pop(0)
            out.append(
                Generation(text=text, prompt_tokens=1, completion_tokens=1, finish_reason="stop")
            )
        return out

    def count_tokens(self, messages: list) -> int:
        return 1

    def close(self) -> None:
        pass


def test_h0_episodes_through_the_harness_host(sample: list[Puzzle]) -> None:
    from whale_lab.backends.base import SamplingParams
    from whale_lab.harness import HarnessHost
    from whale_lab.rollout import run_episodes

    dom = ChessDomain(sample, seed=0, sizes={"weight": 5, "harness": 2, "val": 2, "test": 2})
    tasks = {t.id: t for s in SPLITS for t in dom.tasks(s)}
    script = {
        "00008": ["<move>e6e7</move>", "<move>b3c1</move>", "<move>h6c1</move>"],
        "0000D": ["<move>g8h8</move>"],
        "0008Q": ["<move>a1a2</move>", "<move>f5e5</move>", "ok <move>E5E6</move>"],
        "0009B": ["I would play Bxg4", "still no tag"],
        "000hf": ["<move>a1a2</move>", "<move>a8a1</move>"],
    }
    model = _ReplayModel({f"FEN: {tasks[k].fields['fen']}": v for k, v in script.items()})
    with HarnessHost(H0, "chess") as host:
        traces = run_episodes(
            [(tasks[k], 0) for k in script], dom, host, model, SamplingParams(max_new_tokens=16)
        )
    got = {t.task_id: t for t in traces}
    assert {k: (t.stop_reason, t.reward) for k, t in got.items()} == {
        "00008": ("solved", 1.0),
        "0000D": ("wrong_move", 0.0),
        "0008Q": ("solved", 1.0),
        "0009B": ("format_failure", 0.0),
        "000hf": ("illegal_moves", 0.0),
    }
    assert got["00008"].n_turns == 3 and got["00008"].info["solved_plies"] == 5
    assert got["0008Q"].illegal_moves == 1
    assert "Illegal move a1a2: there is no piece on a1" in got["0008Q"].turns[0].feedback["detail"]
    assert got["000hf"].info["illegal_attempts"] == 2
    assert "the rook on a1 is white's" in got["000hf"].turns[0].feedback["detail"]
    second_prompt = model.prompts[f"FEN: {tasks['00008'].fields['fen']}"][1]
    assert "Opponent's last move: b2b1 (SAN Qb1+)" in second_prompt[-1]["content"]
