"""Calibration: does the micro model leave room for both levers, and which one binds where?

`whale-lab micro calibrate [--domain D] [--tasks N]` (in `whale_lab.commands.micro`) measures, for
each built-in domain, val mean@k under the base harness h0 and under a stronger hand-written
harness (`harnesses/<domain>/calibration_strong.py`) with the weights fixed; with
`--rsft-epochs E` it then runs online RSFT under h0 for E epochs of the weight split (the
project's own `RsftPhase`, LoRA, weights updated in place) and measures both harnesses again. The
command prints a Markdown table for the README. The targets (issue "embedded default"): h0
between 5% and 40%; search harness-limited (strong - h0 >= 15 points, more than RSFT adds); math
weight-limited (RSFT adds >= 15 points, the harness alone < 5); chess: both levers help. On
chess, with an in-process (hf) backend, it also reports the listed-move mass (`move_mass.py`):
how much probability the model puts on the legal moves it is shown, which says whether a harness
layout can help at all.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
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
    rsft_h0: float | None = None
    rsft_strong: float | None = None
    rsft_epochs: float = 0.0
    rsft_rollouts: int = 0
    seconds: float = 0.0
    diagnostics: dict[str, dict[str, float]] | None = None
    # chess: probability on the listed legal moves after "<move>", per measurement label
    move_mass: dict[str, float] | None = None


def harness_paths(domain: str) -> tuple[Path, Path]:
    """(h0, calibration_strong) for a domain, or FileNotFoundError naming the missing file."""
    h0 = REPO_ROOT / "harnesses" / domain / "h0.py"
    strong = REPO_ROOT / "harnesses" / domain / STRONG_NAME
    for p in (h0, strong):
        if not p.exists():
            raise FileNotFoundError(f"calibration needs the harness file {p}, which is missing")
    return h0, strong


def calibrate_domain(
    domain_name: str,
    *,
    cfg: Any,
    tasks: int,
    k: int,
    rsft_epochs: float = 0.0,
    log: Callable[[str], None] = print,
) -> CalibrationRow:
    """Measure one domain: h0 and strong on val, then (optionally) RSFT under h0 and both again."""
    from whale_lab.backends import make_backend
    from whale_lab.config import SplitSizes
    from whale_lab.context import Evaluator, RunContext
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import sampling_params

    t0 = time.perf_counter()
    h0_path, strong_path = harness_paths(domain_name)
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
    val = domain.tasks("val")
    diagnostics: dict[str, dict[str, float]] = {}
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
        report = evaluator.score(path, val, k, params)
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
        )
        if rsft_epochs > 0:
            from whale_lab.store import RunStore
            from whale_lab.weights.rsft import RsftPhase

            with tempfile.TemporaryDirectory(prefix="whale-calibrate-") as tmp:
                store = RunStore.create(tmp, f"calibrate-{domain_name}")
                phase = RsftPhase(RunContext.of(cfg, backend, domain, store, lambda event: None))
                result = phase.run(h0_path, epochs=rsft_epochs)
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
    row.seconds = time.perf_counter() - t0
    row.diagnostics = diagnostics
    row.move_mass = move_mass or None
    return row


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _delta(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{100 * (a - b):+.1f}"


def markdown_table(rows: Sequence[CalibrationRow]) -> str:
    """The README table: mean@k in percent per domain, harness and weight levers."""
    k = rows[0].k if rows else 8
    head = (
        f"| domain | tasks | h0 mean@{k} | strong harness | harness lever | RSFT + h0 | "
        f"weight lever | RSFT + strong |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r.domain} | {r.n_tasks} | {_pct(r.h0)} | {_pct(r.strong)} | "
            f"{_delta(r.strong, r.h0)} | {_pct(r.rsft_h0)} | {_delta(r.rsft_h0, r.h0)} | "
            f"{_pct(r.rsft_strong)} |"
        )
    return "\n".join(lines)
