"""`whale-lab search`: harness-only Meta-Harness search on fixed weights, resumable.

The whole harness budget (`harness_search.iterations`) runs as one phase on the frozen
model. Progress is printed as the phase goes; in `manual` approval mode each valid candidate is
shown as a diff with its hypothesis and the terminal asks for a decision. Ctrl-C or SIGTERM stops
at the next safe point (recorded; exit 130 or 143), a second Ctrl-C leaves at once. Stopped,
killed or left pending, it resumes with `whale-lab search --resume RUN_DIR`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, TextIO

from whale_lab.commands.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PENDING,
    EXIT_STOPPED,
    StopSignals,
    run_in_worker,
    stderr_console,
)
from whale_lab.config import Config, ConfigError, config_from_dict
from whale_lab.events import (
    CandidateProposed,
    CandidateScored,
    CandidateValidated,
    EpisodeFinished,
    Event,
    HarnessAccepted,
    Log,
    PhaseEnded,
    PhaseStarted,
    ProposerUsage,
    ReviewDecided,
    RunFinished,
    RunStarted,
)
from whale_lab.reviewers import TerminalReviewer
from whale_lab.store import RunStore, atomic_write_json, read_json


class ProgressPrinter:
    """One line per phase event, plus an episode counter while a candidate is scored."""

    def __init__(self, out: TextIO | None = None, live: bool | None = None) -> None:
        self.out = out or sys.stderr
        self.live = self.out.isatty() if live is None else live
        self.episodes = 0
        self.current = ""

    def _line(self, text: str) -> None:
        if self.live and self.episodes:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        self.out.flush()

    def __call__(self, ev: Event) -> None:
        if isinstance(ev, EpisodeFinished) and ev.phase == "harness":
            if ev.harness != self.current:
                self.current, self.episodes = ev.harness, 0
            self.episodes += 1
            if self.live:
                self.out.write(f"\r  {ev.harness}: {self.episodes} episodes")
                self.out.flush()
            return
        text = _describe(ev)
        if text:
            self._line(text)
            self.episodes = 0


def _describe(ev: Event) -> str:
    if isinstance(ev, PhaseStarted):
        return f"harness search: {int(ev.budget)} iterations from {ev.harness}"
    if isinstance(ev, CandidateProposed):
        first = ev.hypothesis.splitlines()[0] if ev.hypothesis else ""
        return (
            f"[iter {ev.iteration}] {ev.candidate_id} proposed by {ev.proposer} "
            f"({ev.surface or 'incoming'}): {first[:90]}"
        )
    if isinstance(ev, CandidateValidated):
        if ev.valid:
            smoke = "" if ev.smoke_success is None else f", smoke {ev.smoke_success:.0%}"
            return f"  {ev.candidate_id} valid{smoke}"
        return f"  {ev.candidate_id} invalid: {ev.reason[:160]}"
    if isinstance(ev, ReviewDecided):
        why = f" ({ev.reason})" if ev.reason else ""
        return f"  {ev.candidate_id} {ev.decision} by {ev.by}{why}"
    if isinstance(ev, CandidateScored):
        return (
            f"  {ev.candidate_id} {ev.status}: success {ev.success_rate:.1%}, "
            f"{ev.mean_turns:.2f} turns, {ev.rollouts} rollouts"
        )
    if isinstance(ev, ProposerUsage):
        if ev.prompt_tokens or ev.completion_tokens:
            return (
                f"  proposer {ev.proposer}: {ev.prompt_tokens}+{ev.completion_tokens} tokens, "
                f"${ev.cost:.4f}, {ev.seconds:.1f}s"
            )
        return ""
    if isinstance(ev, HarnessAccepted):
        pin = " (pinned)" if ev.pinned else ""
        return f"accepted {ev.candidate_id}{pin}: success {ev.success_rate:.1%} -> {ev.path}"
    if isinstance(ev, Log):
        return f"  {ev.level}: {ev.message}"
    return ""


def _latest_search_run(directory: str) -> Path | None:
    base = Path(directory)
    runs = sorted(
        (p for p in base.glob("*") if (p / "search.json").exists()), key=lambda p: p.stat().st_mtime
    )
    return runs[-1] if runs else None


def _open_store(cfg: Config, run_dir: str | None, resume: bool) -> tuple[RunStore, Config, bool]:
    if resume:
        path = Path(run_dir) if run_dir else _latest_search_run(cfg.run.directory)
        if path is None or not path.is_dir():
            raise ConfigError(f"--resume: run folder {run_dir or cfg.run.directory!r} not found")
        if not (path / "search.json").exists():
            raise ConfigError(f"--resume: {path} is not a `whale-lab search` run (no search.json)")
        saved = read_json(path / "config.json")
        if isinstance(saved, dict):
            cfg = config_from_dict(saved)
        return RunStore(path), cfg, True
    if run_dir:
        store = RunStore(run_dir)
    else:
        store = RunStore.create(cfg.run.directory, f"search-{cfg.domain.name}")
    atomic_write_json(store.root / "config.json", cfg.to_dict())
    return store, cfg, False


def run_search(
    cfg: Config,
    run_dir: str | None = None,
    resume: bool = False,
    *,
    reviewer: Any = None,
    backend: Any = None,
    out: TextIO | None = None,
) -> int:
    """Harness-only search; returns 0 done, 3 left pending a review, 130/143 stopped by
    SIGINT/SIGTERM, 1 failed.

    `reviewer` and `backend` let an embedding program (or a test) supply its own; by default the
    terminal reviews in manual mode and the backend is built from the config.
    """
    with StopSignals(stderr_console()) as signals:
        return _search(cfg, run_dir, resume, reviewer, backend, out, signals)


def _search(
    cfg: Config,
    run_dir: str | None,
    resume: bool,
    reviewer: Any,
    backend: Any,
    out: TextIO | None,
    signals: StopSignals,
) -> int:
    from whale_lab.backends import make_backend
    from whale_lab.context import RunContext
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import default_harness_path
    from whale_lab.quiet import quiet_libraries
    from whale_lab.search.approval import ApprovalGate
    from whale_lab.search.meta_harness import HarnessPhase, HarnessPhaseError

    quiet_libraries()
    out = out or sys.stderr
    if not resume:
        incoming = Path(default_harness_path(cfg))
        if not incoming.is_file():
            raise ConfigError(f"domain.harness: harness file {incoming} not found")
    store, cfg, resumed = _open_store(cfg, run_dir, resume)
    signals.resume_at(store.root, f"resume with: whale-lab search --resume {store.root}")
    domain: Any = None
    own_backend = backend is None
    try:
        meta = read_json(store.root / "search.json", {}) or {}
        incoming = Path(meta.get("incoming") or default_harness_path(cfg))
        if not incoming.is_file():
            raise ConfigError(f"domain.harness: harness file {incoming} not found")
        iterations = int(meta.get("iterations") or cfg.harness_search.iterations)
        atomic_write_json(
            store.root / "search.json",
            {"incoming": str(incoming.resolve()), "iterations": iterations},
        )
        store.subscribe(ProgressPrinter(out))
        headless = False
        if reviewer is None and cfg.approval.mode == "manual":
            if sys.stdin.isatty():
                reviewer = TerminalReviewer()
            else:
                headless = True
                out.write(
                    f"stdin is not a terminal: approval.mode manual -> "
                    f"{cfg.approval.headless_mode} (approval.headless_mode)\n"
                )
        store.emit(
            RunStarted(
                run_id=store.run_id,
                domain=cfg.domain.name,
                model=cfg.model.path,
                schedule="harness-only",
                harness=str(incoming),
                config=cfg.to_dict(),
                resumed=resumed,
            )
        )
        domain = make_domain(cfg)
        if own_backend:
            backend = make_backend(cfg)
        gate = ApprovalGate.from_config(cfg.approval, reviewer, headless=headless)
        phase = HarnessPhase(
            RunContext.of(cfg, backend, domain, store), reviewer, cycle=1, gate=gate
        )
        store.emit(
            PhaseStarted(
                cycle=1,
                phase="harness",
                budget=float(iterations),
                budget_unit="iterations",
                harness=str(incoming),
            )
        )
        try:
            result = run_in_worker(
                lambda: phase.run(incoming, iterations=iterations, should_stop=signals)
            )
        except KeyboardInterrupt:
            store.emit(RunFinished(status="stopped", message="interrupted"))
            out.write(f"\ninterrupted; resume with: whale-lab search --resume {store.root}\n")
            return EXIT_STOPPED
        except HarnessPhaseError as exc:
            store.emit(RunFinished(status="failed", message=str(exc)))
            out.write(f"whale-lab search: error: {exc}\n")
            return EXIT_FAILED
        if result.status == "stopped":
            store.emit(
                RunFinished(
                    status="stopped",
                    message=f"stopped at a safe point ({signals.reason()}) after "
                    f"{result.iterations_done} iterations",
                )
            )
            out.write(f"stopped; resume with: whale-lab search --resume {store.root}\n")
            return signals.exit_code
        store.emit(
            PhaseEnded(
                cycle=1,
                phase="harness",
                reason=result.reason,
                harness_rollouts=result.harness_rollouts,
            )
        )
        if result.status == "pending":
            store.emit(RunFinished(status="stopped", message=f"pending review: {result.pending}"))
            out.write(
                f"{', '.join(result.pending)} awaits review; resume with: "
                f"whale-lab search --resume {store.root}\n"
            )
            return EXIT_PENDING
        best = {
            "candidate_id": result.accepted_id,
            "success_rate": result.success_rate,
            "path": result.accepted_path,
        }
        store.emit(RunFinished(status="completed", best=best))
        summary = Path(result.archive_dir) / "summary.md"
        out.write(f"summary: {summary}\nharness rollouts: {result.harness_rollouts}\n")
        if result.history:
            out.write(
                "best success per iteration: " + " ".join(f"{h:.1%}" for h in result.history) + "\n"
            )
        return EXIT_OK
    finally:
        if own_backend and backend is not None:
            backend.close()
        if domain is not None:
            domain.close()
        store.close()
