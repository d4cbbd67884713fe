"""Calibration: does the micro model leave room for both levers, and which one binds where?

`whale-lab micro calibrate [--domain D] [--tasks N]` (in `whale_lab.commands.micro`) measures, for
each built-in domain, val mean@k under the base harness h0 and under a stronger hand-written
harness (`harnesses/<domain>/calibration_strong.py`) with the weights fixed; with
`--rsft-epochs E` it then runs online RSFT under h0 for E epochs of the weight split (the
project's own `RsftPhase`, LoRA, weights updated in place) and measures both harnesses again. The
command prints a Markdown table for the README. Every lever is a paired comparison (the same
val tasks and per-episode seeds in both arms, `whale_lab.paired`): the difference with its 95%
bootstrap interval over tasks, and, after RSFT, the interaction (the harness's gain after the
weight update minus its gain before) with its own. The targets (issue "embedded default"): h0
between 5% and 40%; search harness-limited (strong - h0 >= 15 points, more than RSFT adds); math
weight-limited (RSFT adds >= 15 points, the harness alone < 5); chess: both levers help. On
chess, with an in-process (hf) backend, it also reports the listed-move mass (`move_mass.py`):
how much probability the model puts on the legal moves it is shown, which says whether a harness
layout can help at all, and mean@k by what the puzzle's first solver move does (mate, capture,
check, quiet), which says where a lever gained or lost. `--chess-variants` scores chess h0
against harnesses that differ from it in one thing each (every legal-move layout pre-training drew,
the illegal-move retry budget, the order of the list, what a retry's context keeps), to say whether
the model reads anything it was taught better than h0's view before a stronger chess harness is
built on it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("math", "search", "chess")
STRONG_NAME = "calibration_strong.py"


@dataclass
class CalibrationRow:
    """One domain's measurements (mean@k as fractions; None where not measured)."""

    domain: str
    n_tasks: int
    k: int
    h0: float
    strong: float
    formats: str = "trained"  # "held-out": both harnesses in formats pre-training never drew
    rsft_h0: float | None = None
    rsft_strong: float | None = None
    rsft_epochs: float = 0.0
    rsft_rollouts: int = 0
    seconds: float = 0.0
    diagnostics: dict[str, dict[str, float]] | None = None
    # chess: probability on the listed legal moves after "<move>", per measurement label
    move_mass: dict[str, float] | None = None
    # chess: label -> kind of the puzzle's first solver move -> mean@k over those tasks, and
    # the number of tasks of each kind, so a lever can be traced to the moves it changed
    by_first_move: dict[str, dict[str, float]] | None = None
    first_move_tasks: dict[str, int] | None = None
    # per measurement label ("h0", "strong", "rsft+h0", "rsft+strong"): task id -> mean reward
    task_means: dict[str, dict[str, float]] = field(default_factory=dict)
    # lever name -> PairedResult.to_dict(); "interaction": InteractionEffect.to_dict()
    paired: dict[str, Any] = field(default_factory=dict)


#: The levers a row reports: (name, arm A, arm B), each B minus A on the same tasks.
LEVERS = (
    ("harness", "h0", "strong"),
    ("weight", "h0", "rsft+h0"),
    ("harness after RSFT", "rsft+h0", "rsft+strong"),
)


def paired_levers(scores: dict[str, dict[str, list[float | None]]]) -> dict[str, Any]:
    """Each lever whose two arms were measured, paired over tasks, and the interaction when all
    four were (the harness's gain after RSFT minus its gain before)."""
    from whale_lab.paired import interaction_effect, paired_difference

    out: dict[str, Any] = {}
    for name, a, b in LEVERS:
        if a in scores and b in scores:
            out[name] = paired_difference(scores[a], scores[b]).to_dict()
    if all(label in scores for label in ("h0", "strong", "rsft+h0", "rsft+strong")):
        out["interaction"] = interaction_effect(
            scores["h0"], scores["strong"], scores["rsft+h0"], scores["rsft+strong"]
        ).to_dict()
    return out


#: Kinds of a chess puzzle's first solver move, the order of the breakdown.
FIRST_MOVE_KINDS = ("mate", "capture", "check", "quiet")


def first_move_kind(fen: str, moves: Sequence[str]) -> str:
    """What the solver's first move does: `mate`, `capture`, `check` or `quiet` (the first listed
    that applies). The line's first move is the opponent's trigger; the solver's comes second."""
    import chess

    board = chess.Board(fen)
    board.push_uci(moves[0])
    move = chess.Move.from_uci(moves[1])
    if board.is_capture(move):
        board.push(move)
        mate = board.is_checkmate()
        board.pop()
        return "mate" if mate else "capture"
    board.push(move)
    if board.is_checkmate():
        return "mate"
    return "check" if board.is_check() else "quiet"


def first_move_kinds(tasks: Sequence[Any]) -> tuple[dict[str, str], dict[str, int]]:
    """Each chess task's first-move kind by task id, and how many tasks each kind has."""
    kinds = {t.id: first_move_kind(t.answer["fen"], t.answer["moves"]) for t in tasks}
    counts = {kind: n for kind in FIRST_MOVE_KINDS if (n := sum(v == kind for v in kinds.values()))}
    return kinds, counts


def by_first_move(
    kinds: dict[str, str], task_means: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Per measurement label, mean@k over the tasks of each first-move kind (kinds with no task
    left out): where in the puzzles a harness or a weight update gains or loses."""
    out: dict[str, dict[str, float]] = {}
    for label, means in task_means.items():
        row: dict[str, float] = {}
        for kind in FIRST_MOVE_KINDS:
            vals = [v for task, v in means.items() if kinds.get(task) == kind]
            if vals:
                row[kind] = round(sum(vals) / len(vals), 4)
        out[label] = row
    return out


def harness_paths(domain: str) -> tuple[Path, Path]:
    """(h0, calibration_strong) for a domain, or FileNotFoundError naming the missing file."""
    h0 = REPO_ROOT / "harnesses" / domain / "h0.py"
    strong = REPO_ROOT / "harnesses" / domain / STRONG_NAME
    for p in (h0, strong):
        if not p.exists():
            raise FileNotFoundError(f"calibration needs the harness file {p}, which is missing")
    return h0, strong


def _measuring(cfg: Any, domain_name: str, tasks: int, k: int) -> tuple[Any, ...]:
    """(cfg, domain, backend, sampling params, evaluator, val tasks) for `tasks` val tasks at k:
    every arm is scored by one evaluator with the same seeds, so arms pair task by task."""
    from whale_lab.backends import make_backend
    from whale_lab.config import SplitSizes
    from whale_lab.context import Evaluator
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import sampling_params

    splits = replace(cfg.domain.splits, val=tasks)
    if not isinstance(splits, SplitSizes):  # pragma: no cover - defensive
        raise TypeError("domain.splits")
    cfg = cfg.replace(
        domain=replace(cfg.domain, name=domain_name, splits=splits, harness=""),
        sampling=replace(cfg.sampling, k=k),
    )
    domain = make_domain(cfg)
    backend = make_backend(cfg)
    params = sampling_params(cfg, cfg.run.seed)
    evaluator = Evaluator.from_config(cfg, backend, domain)
    return cfg, domain, backend, params, evaluator, domain.tasks("val")


def calibrate_domain(
    domain_name: str,
    *,
    cfg: Any,
    tasks: int,
    k: int,
    rsft_epochs: float = 0.0,
    held_out: bool = False,
    log: Callable[[str], None] = print,
) -> CalibrationRow:
    """Measure one domain: h0 and strong on val, then (optionally) RSFT under h0 and both again.

    `held_out`: h0 and strong are scored in the formats pre-training never drew
    (`styles.held_out_harness`); RSFT still trains under the shipped h0, so the weight lever there
    says how far what RSFT taught carries to formats the model was not taught."""
    from whale_lab.context import RunContext

    t0 = time.perf_counter()
    h0_path, strong_path = harness_paths(domain_name)
    train_path = h0_path  # RSFT always trains under the shipped h0
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if held_out:
        scratch = tempfile.TemporaryDirectory(prefix="whale-calibrate-held-out-")
        from whale_lab.micro.styles import held_out_harness

        h0_path = Path(scratch.name) / "h0_held_out.py"
        strong_path = Path(scratch.name) / "strong_held_out.py"
        h0_path.write_text(held_out_harness(domain_name, strong=False), encoding="utf-8")
        strong_path.write_text(held_out_harness(domain_name, strong=True), encoding="utf-8")
    cfg, domain, backend, params, evaluator, val = _measuring(cfg, domain_name, tasks, k)
    diagnostics: dict[str, dict[str, float]] = {}
    scores: dict[str, dict[str, list[float | None]]] = {}
    move_mass: dict[str, float] = {}

    def mass(path: Path, label: str) -> None:
        model, tokenizer = getattr(backend, "model", None), getattr(backend, "tokenizer", None)
        if domain_name != "chess" or model is None or tokenizer is None:
            return
        from whale_lab.micro.move_mass import listed_move_mass

        m = listed_move_mass(model, tokenizer, domain, val, path)
        move_mass[label] = round(m.listed, 4)
        log(f"  {domain_name:6s} {label:13s} {m.summary()}")

    def score(path: Path, label: str) -> float:
        from whale_lab.paired import scores_by_task

        report = evaluator.score(path, val, k, params)  # the same seeds for every arm: paired
        scores[label] = scores_by_task(report.traces)
        diagnostics[label] = {
            key: round(float(v), 4)
            for key, v in report.diagnostics.items()
            if isinstance(v, (int, float))
        }
        log(
            f"  {domain_name:6s} {label:13s} mean@{k} {report.mean_at_k:.3f}  "
            f"pass@{k} {report.pass_at_k:.3f}  ({report.seconds:.0f}s)"
        )
        mass(path, label)
        return float(report.mean_at_k)

    try:
        row = CalibrationRow(
            domain=domain_name,
            n_tasks=len(val),
            k=k,
            h0=score(h0_path, "h0"),
            strong=score(strong_path, "strong"),
            formats="held-out" if held_out else "trained",
        )
        if rsft_epochs > 0:
            from whale_lab.store import RunStore
            from whale_lab.weights.rsft import RsftPhase

            with tempfile.TemporaryDirectory(prefix="whale-calibrate-") as tmp:
                store = RunStore.create(tmp, f"calibrate-{domain_name}")
                phase = RsftPhase(RunContext.of(cfg, backend, domain, store, lambda event: None))
                result = phase.run(train_path, epochs=rsft_epochs)
                store.close()
            row.rsft_epochs = rsft_epochs
            row.rsft_rollouts = int(result.rollouts)
            log(
                f"  {domain_name:6s} rsft          {result.steps} steps, {result.rollouts} "
                f"rollouts, {result.kept} kept"
            )
            row.rsft_h0 = score(h0_path, "rsft+h0")
            row.rsft_strong = score(strong_path, "rsft+strong")
    finally:
        backend.close()
        domain.close()
        if scratch is not None:
            scratch.cleanup()
    row.seconds = time.perf_counter() - t0
    row.diagnostics = diagnostics
    from whale_lab.paired import task_means

    row.task_means = {label: task_means(s) for label, s in scores.items()}
    row.paired = paired_levers(scores)
    row.move_mass = move_mass or None
    if domain_name == "chess":
        kinds, row.first_move_tasks = first_move_kinds(val)
        row.by_first_move = by_first_move(kinds, row.task_means)
        for label, parts in row.by_first_move.items():
            shown = ", ".join(
                f"{kind} {100 * v:.1f}% ({row.first_move_tasks[kind]})" for kind, v in parts.items()
            )
            log(f"  {domain_name:6s} {label:13s} by first move: {shown}")
    return row


@dataclass(frozen=True)
class ChessVariant:
    """A chess harness that is h0 but for one thing, scored against h0 by `chess_variants`."""

    name: str
    differs: str  # what differs from h0, for the table
    layout: str = "raw"
    illegal_budget: int | None = None  # None: h0's
    show_board: bool = False
    forcing_first: bool = False
    clean_retries: bool = False
    notes: bool = False  # the layout also names what each move does (`--chess-notes-share`)

    def source(self) -> str:
        from whale_lab.micro.styles import chess_variant

        return chess_variant(
            self.layout,
            illegal_budget=self.illegal_budget,
            show_board=self.show_board,
            forcing_first=self.forcing_first,
            clean_retries=self.clean_retries,
            notes=self.notes,
        )


CHESS_VARIANTS = (
    ChessVariant(
        "annotated", "legal moves with the captured piece named, check and mate", "annotated"
    ),
    ChessVariant("annotated+board", "the same with the ASCII board", "annotated", show_board=True),
    ChessVariant("san_list", "one line of uci (san) pairs", "san_list"),
    ChessVariant("board_san", "board and a uci = san list, no FEN", "board_san"),
    ChessVariant("uci_only", "FEN and bare UCI moves, no SAN", "uci_only"),
    ChessVariant("san_list+notes", "the san_list with each move's notes", "san_list", notes=True),
    ChessVariant(
        "board_san+notes", "the board_san list with each move's notes", "board_san", notes=True
    ),
    ChessVariant(
        "uci_only+notes", "the uci_only list with each move's notes", "uci_only", notes=True
    ),
    ChessVariant("no illegal retry", "h0's view, 0 illegal-move retries", illegal_budget=0),
    ChessVariant("3 illegal retries", "h0's view, 3 illegal-move retries", illegal_budget=3),
    ChessVariant("10 illegal retries", "h0's view, 10 illegal-move retries", illegal_budget=10),
    ChessVariant(
        "10 clean retries",
        "the same, each retry without the rejected reply and its feedback",
        illegal_budget=10,
        clean_retries=True,
    ),
    ChessVariant(
        "forcing moves first",
        "h0's list reordered: mates, checks, captures, then the rest",
        forcing_first=True,
    ),
)


@dataclass
class VariantRow:
    """One chess harness scored against h0 on the same val tasks and seeds."""

    name: str
    differs: str
    mean: float
    illegal_per_turn: float
    by_first_move: dict[str, float]
    # the paired difference against h0 (PairedResult.to_dict()); None for h0's own row
    paired: dict[str, Any] | None = None


def chess_variants(
    *, cfg: Any, tasks: int, k: int, log: Callable[[str], None] = print
) -> tuple[list[VariantRow], dict[str, int]]:
    """h0 and each of `CHESS_VARIANTS` (h0 but for one thing, `styles.chess_variant`), scored on
    the same val tasks and seeds, each paired against h0; with the first-move kinds' task counts."""
    from whale_lab.paired import paired_difference, scores_by_task, task_means

    cfg, domain, backend, params, evaluator, val = _measuring(cfg, "chess", tasks, k)
    kinds, counts = first_move_kinds(val)
    rows: list[VariantRow] = []
    base: dict[str, list[float | None]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="whale-chess-variants-") as tmp:
            arms = [("h0", "-", harness_paths("chess")[0])]
            for variant in CHESS_VARIANTS:
                stem = variant.name.replace(" ", "_").replace("+", "_")
                path = Path(tmp) / f"{stem}.py"
                path.write_text(variant.source(), encoding="utf-8")
                arms.append((variant.name, variant.differs, path))
            for name, differs, path in arms:
                report = evaluator.score(path, val, k, params)
                scores = scores_by_task(report.traces)
                if name == "h0":
                    base = scores
                row = VariantRow(
                    name=name,
                    differs=differs,
                    mean=float(report.mean_at_k),
                    illegal_per_turn=round(
                        float(report.diagnostics.get("illegal_move_rate", 0.0)), 4
                    ),
                    by_first_move=by_first_move(kinds, {name: task_means(scores)})[name],
                    paired=None if name == "h0" else paired_difference(base, scores).to_dict(),
                )
                rows.append(row)
                log(
                    f"  chess  {name:18s} mean@{k} {row.mean:.3f}  "
                    f"vs h0 {_lever(row.paired)}  ({report.seconds:.0f}s)"
                )
    finally:
        backend.close()
        domain.close()
    return rows, counts


def variants_table(rows: Sequence[VariantRow], counts: dict[str, int], k: int) -> str:
    """The chess variants as a Markdown table: mean@k, the paired difference against h0 with its
    interval, the illegal moves per turn and mean@k by the kind of the first solver move."""
    kinds = [kind for kind in FIRST_MOVE_KINDS if kind in counts]
    head = (
        f"| harness | differs from h0 in | mean@{k} | vs h0 | illegal moves per turn | "
        + " | ".join(f"{kind} ({counts[kind]})" for kind in kinds)
        + " |\n|"
        + "---|" * (5 + len(kinds))
    )
    lines = [head]
    notes: list[str] = []
    for r in rows:
        parts = " | ".join(_pct(r.by_first_move.get(kind)) for kind in kinds)
        lines.append(
            f"| {r.name} | {r.differs} | {_pct(r.mean)} | {_lever(r.paired)} | "
            f"{r.illegal_per_turn:.2f} | {parts} |"
        )
        if r.paired and not r.paired.get("excludes_zero"):
            notes.append(_undetected(r.name, r.paired))
    if rows:
        lines.append("")
        lines.append(
            "vs h0: the variant minus h0 in points on the same val tasks and seeds, 95% "
            "percentile bootstrap interval over tasks; the kinds: what the puzzle's first solver "
            "move does (tasks in brackets)."
        )
        lines.extend(notes)
    return "\n".join(lines)


def _undetected(label: str, result: dict[str, Any]) -> str:
    """The line under a table for a paired difference whose interval includes zero."""
    need = result.get("needed_tasks")
    size = f"; about {need} tasks would resolve a difference this size" if need else ""
    return (
        f"- {label}: {_lever(result)} on {result['n_tasks']} tasks, "
        f"no difference detected at this size{size}"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _lever(result: dict[str, Any] | None) -> str:
    """A paired difference in points with its interval: `+18.6 [+12.0, +25.1]`."""
    if not result:
        return "-"
    low, high = result.get("low"), result.get("high")
    bounds = (
        f" [{100 * low:+.1f}, {100 * high:+.1f}]" if low is not None and high is not None else ""
    )
    return f"{100 * result['diff']:+.1f}{bounds}"


def markdown_table(rows: Sequence[CalibrationRow]) -> str:
    """The README table: mean@k in percent per domain; each lever a paired difference in points
    with its 95% interval over tasks; under it, a line per lever whose interval includes zero."""
    k = rows[0].k if rows else 8
    head = (
        f"| domain | tasks | h0 mean@{k} | strong harness | harness lever | RSFT + h0 | "
        f"weight lever | RSFT + strong | harness lever after RSFT | interaction |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    notes: list[str] = []
    for r in rows:
        inter = r.paired.get("interaction", {}).get("interaction")
        name = r.domain if r.formats == "trained" else f"{r.domain} (held-out formats)"
        lines.append(
            f"| {name} | {r.n_tasks} | {_pct(r.h0)} | {_pct(r.strong)} | "
            f"{_lever(r.paired.get('harness'))} | {_pct(r.rsft_h0)} | "
            f"{_lever(r.paired.get('weight'))} | {_pct(r.rsft_strong)} | "
            f"{_lever(r.paired.get('harness after RSFT'))} | {_lever(inter)} |"
        )
        named = [(name, r.paired.get(name)) for name, _, _ in LEVERS]
        for name, result in [*named, ("interaction", inter)]:
            if result and not result.get("excludes_zero"):
                notes.append(_undetected(f"{r.domain}, {name}", result))
    if rows:
        lines.append("")
        lines.append(
            "Levers: B minus A in points on the same val tasks and seeds, 95% percentile "
            "bootstrap interval over tasks; interaction: the harness lever after RSFT minus before."
        )
        lines.extend(notes)
    return "\n".join(lines)
