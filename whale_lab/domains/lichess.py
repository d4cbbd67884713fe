"""Read the Lichess puzzle database CSV into `Puzzle` records.

Layout: ``PuzzleId,FEN,Moves,Rating,RatingDeviation,Popularity,NbPlays,Themes,GameUrl,OpeningTags``.
`FEN` is the position before the opponent's trigger move, `Moves[0]` is that trigger, and the
solver's moves are `Moves[1], Moves[3], ...`. Only PuzzleId, FEN and Moves are required; the rest
may be empty (trimmed copies of the database often leave them so). A header row is expected; a
file without one is read in the column order above.

Every problem is a `DataError` that names the file, the line and what is wrong.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_lab.domains.chess_puzzles import Puzzle, line_problem
from whale_lab.domains.errors import DataError

COLUMNS = (
    "PuzzleId",
    "FEN",
    "Moves",
    "Rating",
    "RatingDeviation",
    "Popularity",
    "NbPlays",
    "Themes",
    "GameUrl",
    "OpeningTags",
)
REQUIRED = ("PuzzleId", "FEN", "Moves")
_INT_COLUMNS = ("Rating", "RatingDeviation", "Popularity", "NbPlays")
_UCI = re.compile(r"^[a-h][1-8][a-h][1-8][qrbn]?$")


def _open_text(path: Path) -> io.TextIOBase:
    name = path.name.lower()
    if name.endswith(".zst"):
        raise DataError(
            f"{path}: zstandard-compressed; decompress it first "
            f"(e.g. `zstd -d {path.name}`) and point domain.source at the .csv"
        )
    if name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", newline="")
    return path.open(encoding="utf-8-sig", newline="")


def _rows(path: Path) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row by column name) for each non-empty data row."""
    try:
        fh = _open_text(path)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    with fh:
        reader = csv.reader(fh)
        header: list[str] | None = None
        try:
            for raw in reader:
                lineno = reader.line_num
                if not raw or all(not cell.strip() for cell in raw):
                    continue
                cells = [cell.strip() for cell in raw]
                if header is None:
                    if cells[0] == "PuzzleId" or "FEN" in cells:
                        missing = [c for c in REQUIRED if c not in cells]
                        if missing:
                            raise DataError(
                                f"{path}:{lineno}: header lacks column(s) "
                                f"{', '.join(missing)}; expected {','.join(COLUMNS)}"
                            )
                        header = cells
                        continue
                    header = list(COLUMNS)  # no header row: the database's column order
                if len(cells) < 3:
                    raise DataError(
                        f"{path}:{lineno}: expected at least PuzzleId,FEN,Moves, "
                        f"got {len(cells)} column(s)"
                    )
                if len(cells) > len(header):
                    raise DataError(
                        f"{path}:{lineno}: {len(cells)} columns but the header has "
                        f"{len(header)} (an unquoted comma?)"
                    )
                yield lineno, dict(zip(header, cells, strict=False))  # short rows: empty tail
        except csv.Error as exc:
            raise DataError(f"{path}:{reader.line_num}: not valid CSV: {exc}") from None
        except UnicodeDecodeError as exc:
            raise DataError(f"{path}: not UTF-8 text: {exc}") from None


def _row_puzzle(path: Path, lineno: int, row: dict[str, str], replay: bool) -> Puzzle:
    where = f"{path}:{lineno}"
    pid = row.get("PuzzleId", "")
    if not pid:
        raise DataError(f"{where}: empty PuzzleId")
    fen = row.get("FEN", "")
    if not fen:
        raise DataError(f"{where}: puzzle {pid}: empty FEN")
    moves = tuple(m.lower() for m in row.get("Moves", "").split())
    if not moves:
        raise DataError(f"{where}: puzzle {pid}: empty Moves")
    for i, move in enumerate(moves):
        if not _UCI.match(move):
            raise DataError(
                f"{where}: puzzle {pid}: move {i + 1} {move!r} is not a UCI move "
                f"(expected like e2e4 or e7e8q)"
            )
    if replay:
        problem = line_problem(fen, moves)
        if problem:
            raise DataError(f"{where}: puzzle {pid}: {problem}")
    elif len(moves) < 2:
        raise DataError(
            f"{where}: puzzle {pid}: Moves must hold the trigger and at least one "
            f"solver move, got {len(moves)} move(s)"
        )
    ints: dict[str, int | None] = {}
    for col in _INT_COLUMNS:
        text = row.get(col, "")
        if not text:
            ints[col] = None
            continue
        try:
            ints[col] = int(text)
        except ValueError:
            raise DataError(
                f"{where}: puzzle {pid}: {col} must be an integer, got {text!r}"
            ) from None
    extra: dict[str, Any] = {
        "rating_deviation": ints["RatingDeviation"],
        "popularity": ints["Popularity"],
        "nb_plays": ints["NbPlays"],
        "game_url": row.get("GameUrl", ""),
        "opening_tags": row.get("OpeningTags", "").split(),
    }
    return Puzzle(
        id=pid,
        fen=fen,
        moves=moves,
        rating=ints["Rating"],
        themes=tuple(row.get("Themes", "").split()),
        source=str(path),
        line=lineno,
        extra=extra,
    )


def load_lichess_csv(path: str | Path, *, replay: bool = True) -> list[Puzzle]:
    """Every puzzle in a Lichess puzzle CSV (plain or .gz), in file order.

    With `replay=False` only the cheap checks run (columns, UCI syntax, ids); call
    `line_problem` on the puzzles you use. That keeps the 5-million-row database quick to index.
    """
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{p}: is a folder, expected a Lichess puzzle CSV file")
    out: list[Puzzle] = []
    seen: dict[str, int] = {}
    for lineno, row in _rows(p):
        puzzle = _row_puzzle(p, lineno, row, replay)
        if puzzle.id in seen:
            raise DataError(
                f"{p}:{lineno}: duplicate PuzzleId {puzzle.id!r} (first on line {seen[puzzle.id]})"
            )
        seen[puzzle.id] = lineno
        out.append(puzzle)
    if not out:
        raise DataError(
            f"{p}: no puzzles found (expected a header and rows like {','.join(COLUMNS)})"
        )
    return out


def check_puzzle(puzzle: Puzzle) -> None:
    """Replay one puzzle; a DataError naming its file and line when it does not hold."""
    problem = line_problem(puzzle.fen, puzzle.moves)
    if problem:
        where = f"{puzzle.source}:{puzzle.line}" if puzzle.line else puzzle.source or "puzzle"
        raise DataError(f"{where}: puzzle {puzzle.id}: {problem}")
