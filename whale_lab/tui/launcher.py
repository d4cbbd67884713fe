"""Runs from the app: resume the latest unfinished run or start a new one, and say what happens.

`whale-lab` with runs already in `run.directory` offers to resume the latest unfinished one or
to start new; a new run is set up in a dialog (domain, schedule, approval mode) whose answers
become the run's config (the engine writes it to `config.json`). A first-run panel then says what
runs now, what will wait for the user and which key skips ahead.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Label, RadioButton, RadioSet

from whale_lab.config import Config

if TYPE_CHECKING:
    from textual.app import App

    _AppBase = App[int]
else:
    _AppBase = object

DOMAINS = ("math", "search", "chess")
SCHEDULE_KINDS = ("whale", "adaptive", "weight-only", "harness-only", "stagewise", "prompt-only")
APPROVAL_MODES = ("manual", "auto", "threshold")
#: How a run ended, from its last `run_finished` event; runs without one are unfinished.
FINISHED = ("completed", "failed")


@dataclass(frozen=True)
class RunSummary:
    path: Path
    run_id: str
    domain: str
    schedule: str
    status: str  # "completed" | "failed" | "stopped" | "unfinished"
    last_ts: float
    events: int
    #: The live process that has the run open (its engine lock), if another one does: resuming
    #: it here would fail, so the app opens it read-only instead.
    holder: int | None = None

    @property
    def resumable(self) -> bool:
        return self.status not in FINISHED


def summarise_run(folder: Path) -> RunSummary | None:
    """What the launcher shows of one run folder; None for a folder that is not a run."""
    from whale_lab.engine.runlock import holder

    path = folder / "events.jsonl"
    if not path.is_file() or not (folder / "config.json").is_file():
        return None
    run_id, domain, schedule, status, n = folder.name, "", "", "unfinished", 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for line in fh:
            n += 1
            if '"run_started"' not in line and '"run_finished"' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("type") == "run_started":
                run_id = str(rec.get("run_id") or run_id)
                domain, schedule = str(rec.get("domain", "")), str(rec.get("schedule", ""))
                status = "unfinished"
            elif rec.get("type") == "run_finished":
                status = str(rec.get("status") or "stopped")
    mtime = path.stat().st_mtime
    return RunSummary(folder, run_id, domain, schedule, status, mtime, n, holder(folder))


def find_runs(directory: Path) -> list[RunSummary]:
    """Every run folder under `directory`, newest first."""
    if not directory.is_dir():
        return []
    found = [summarise_run(p) for p in directory.iterdir() if p.is_dir()]
    return sorted((r for r in found if r is not None), key=lambda r: -r.last_ts)


def latest_unfinished(runs: list[RunSummary]) -> RunSummary | None:
    return next((r for r in runs if r.resumable), None)


@dataclass(frozen=True)
class NewRun:
    domain: str
    schedule: str
    approval: str

    def apply(self, cfg: Config) -> Config:
        """`cfg` with the dialog's answers; the base harness follows the domain unless the
        config names one for the same domain."""
        domain = cfg.domain
        if domain.name != self.domain:
            domain = dataclasses.replace(domain, name=self.domain, harness="", source="builtin")
        return dataclasses.replace(
            cfg,
            domain=domain,
            schedule=dataclasses.replace(cfg.schedule, kind=self.schedule),  # type: ignore[arg-type]
            approval=dataclasses.replace(cfg.approval, mode=self.approval),  # type: ignore[arg-type]
        )


def first_run_text(cfg: Config, *, switch_key: str = "s", review_key: str = "3") -> Text:
    """What runs now, what will wait for the user, and which key skips ahead."""
    from whale_lab.engine.schedules import plan

    phases = plan(cfg.schedule)
    s = cfg.domain.splits
    t = Text()
    t.append("What runs now\n", style="bold")
    t.append(
        f"  a baseline evaluation of the base harness on val ({s.val} tasks x {cfg.sampling.k} "
        f"samples) and test, then {len(phases)} phases: "
    )
    t.append(
        ", ".join(
            f"{p.kind} {p.budget:g} {'ep' if p.kind == 'weight' else 'it'}" for p in phases[:4]
        )
        + (" ..." if len(phases) > 4 else "")
        + "\n"
    )
    t.append("What will wait for you\n", style="bold")
    if cfg.approval.mode == "manual" and any(p.kind == "harness" for p in phases):
        t.append(
            f"  every harness candidate waits in the Review tab ({review_key}) until you approve, "
            "reject or edit it (approval.mode = manual); the first comes in the first harness "
            "phase, after its smoke run\n"
        )
    elif cfg.approval.mode == "manual":
        t.append("  nothing: this schedule has no harness phase to review\n")
    else:
        t.append(f"  nothing: candidates are decided by approval.mode = {cfg.approval.mode}\n")
    t.append("Skip ahead\n", style="bold")
    t.append(
        f"  {switch_key} ends the current phase at its next safe point (a weight phase hands over "
        "to the harness phase and its first review sooner); p pauses, ? lists every key\n"
    )
    t.append("Enter or Escape closes this panel; the run has already started.", style="dim")
    return t


class StartScreen(ModalScreen["str | None"]):
    """An unfinished run exists: resume it (r), start a new run (n), or quit (q)."""

    DEFAULT_CSS = "StartScreen #start-dialog { width: 90%; max-width: 100; height: auto; }"
    BINDINGS = [
        Binding("r", "answer('resume')", "Resume it", id="start.resume"),
        Binding("n", "answer('new')", "New run", id="start.new"),
        Binding("q,escape", "answer('')", "Quit", id="start.quit"),
    ]

    def __init__(self, run: RunSummary, others: int) -> None:
        super().__init__()
        self.run = run
        self.others = others

    def compose(self) -> ComposeResult:
        r = self.run
        with Vertical(id="start-dialog", classes="dialog"):
            yield Label(Text("An unfinished run is waiting", style="bold"))
            what = f"{r.run_id}  {r.domain or '?'} · {r.schedule or '?'} · {r.status}"
            yield Label(Text(what))
            plural = "run" if self.others == 1 else "runs"
            more = f"({self.others} other {plural} in {r.path.parent})" if self.others else ""
            yield Label(Text(f"{r.events:,} events recorded in {r.path}  {more}", style="dim"))
            if r.holder is not None:
                yield Label(
                    Text(
                        f"It is open in process {r.holder}: r shows it read-only, following its "
                        "events; resume (g) becomes available once that process lets go.",
                        style="yellow",
                    ),
                    id="start-held",
                )
            resume = "Resume it (r)" if r.holder is None else "Follow it read-only (r)"
            with Horizontal(classes="dialog-buttons"):
                yield Button(Text(resume), id="start-resume", variant="primary", compact=True)
                yield Button(Text("New run (n)"), id="start-new", compact=True)
                yield Button(Text("Quit (q)"), id="start-quit", compact=True)

    def on_mount(self) -> None:
        self.query_one("#start-resume", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss({"start-resume": "resume", "start-new": "new"}.get(event.button.id or "", ""))

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)


class NewRunScreen(ModalScreen["NewRun | None"]):
    """Domain, schedule and approval mode of a new run; Enter starts it, Escape goes back."""

    DEFAULT_CSS = """
    NewRunScreen #newrun-dialog { width: 90%; max-width: 110; height: auto; }
    NewRunScreen #newrun-choices { height: auto; }
    NewRunScreen RadioSet { width: 1fr; height: auto; }
    """
    BINDINGS = [
        Binding("enter", "start", "Start", id="newrun.start", priority=True),  # space picks
        Binding("escape", "cancel", "Back", id="newrun.cancel"),
    ]

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.cfg = cfg

    def compose(self) -> ComposeResult:
        current = (self.cfg.domain.name, self.cfg.schedule.kind, self.cfg.approval.mode)
        with Vertical(id="newrun-dialog", classes="dialog"):
            yield Label(Text("New run (written to the run's config.json)", style="bold"))
            with Horizontal(id="newrun-choices"):
                for set_id, title, options, now in (
                    ("newrun-domain", "domain", DOMAINS, current[0]),
                    ("newrun-schedule", "schedule", SCHEDULE_KINDS, current[1]),
                    ("newrun-approval", "approval", APPROVAL_MODES, current[2]),
                ):
                    with RadioSet(id=set_id) as radios:
                        radios.border_title = title
                        for option in options:
                            yield RadioButton(option, value=option == now, name=option)
            yield Label(
                Text(
                    "Tab: next choice · arrows + space: pick · Enter: start · Escape: back",
                    style="dim",
                )
            )

    def _picked(self, set_id: str) -> str:
        radios = self.query_one(f"#{set_id}", RadioSet)
        button = radios.pressed_button
        return str(button.name) if button is not None else ""

    def choice(self) -> NewRun:
        return NewRun(
            self._picked("newrun-domain") or self.cfg.domain.name,
            self._picked("newrun-schedule") or self.cfg.schedule.kind,
            self._picked("newrun-approval") or self.cfg.approval.mode,
        )

    def action_start(self) -> None:
        self.dismiss(self.choice())

    def action_cancel(self) -> None:
        self.dismiss(None)


class FirstRunScreen(ModalScreen[None]):
    """Shown once when a new run starts from the app."""

    DEFAULT_CSS = "FirstRunScreen #firstrun-dialog { width: 90%; max-width: 110; height: auto; }"
    BINDINGS = [Binding("enter,escape", "close", "Close", id="firstrun.close")]

    def __init__(self, text: Text) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        with Vertical(id="firstrun-dialog", classes="dialog"):
            yield Label(Text("A new run", style="bold reverse"))
            yield Label(self.text, id="firstrun-text")

    def action_close(self) -> None:
        self.dismiss()


class Launcher(_AppBase):
    """The app's start (a `WhaleLabApp` mixin): what to open when no run folder was named."""

    #: Set by `run_tui` for a bare `whale-lab`: offer the runs already in `run.directory`.
    offer_runs: bool = False
    cfg: Config
    run_dir: str | None
    run_root: Path | None
    replay_only: bool
    read_only_pid: int | None

    if TYPE_CHECKING:
        from whale_lab.tui.state import RunView

        view: RunView

        def start_engine(self) -> None: ...

        def binding_key(self, binding_id: str) -> str: ...

        def _refresh_all(self) -> None: ...

        def _notice(self, level: str, message: str) -> None: ...

        def _open_read_only_if_held(self) -> None: ...

    def launch(self) -> None:
        """Start the engine, after asking what to open where `offer_runs` says to: the latest
        unfinished run or a new one; with only finished runs, the new-run dialog; with none
        (a fresh clone), the configured run at once."""
        if not self.offer_runs or self.run_dir is not None:
            self.start_engine()
            return
        runs = find_runs(Path(self.cfg.run.directory))
        latest = latest_unfinished(runs)
        if not runs:
            self._start_new(self.cfg)
        elif latest is None:
            self.push_screen(NewRunScreen(self.cfg), self._new_run_chosen)
        else:
            self.push_screen(StartScreen(latest, len(runs) - 1), self._start_answered)

    def _start_answered(self, answer: str | None) -> None:
        runs = find_runs(Path(self.cfg.run.directory))
        latest = latest_unfinished(runs)
        if answer == "resume" and latest is not None:
            self._resume(latest.path)
        elif answer == "new":
            self.push_screen(NewRunScreen(self.cfg), self._new_run_chosen)
        else:
            self.exit(0)

    def _new_run_chosen(self, choice: NewRun | None) -> None:
        if choice is not None:
            self._start_new(choice.apply(self.cfg))
            return
        latest = latest_unfinished(find_runs(Path(self.cfg.run.directory)))
        if latest is None:
            self.exit(0)  # Escape on the only question: nothing to open
        else:
            self.push_screen(StartScreen(latest, 0), self._start_answered)

    def _start_new(self, cfg: Config) -> None:
        self.cfg = cfg
        self.start_engine()
        keys: dict[str, Any] = {
            "switch_key": self.binding_key("control.switch") or "s",
            "review_key": self.binding_key("tab.review") or "3",
        }
        self.push_screen(FirstRunScreen(first_run_text(cfg, **keys)))

    def _resume(self, folder: Path) -> None:
        """Resume `folder`; one that another process holds (its engine lock) opens read-only,
        following that process's events, as `whale-lab tui --run` does: an engine here could
        only fail on the lock."""
        from whale_lab.tui.state import RunFolderError, load_run_events

        self.run_dir, self.run_root = str(folder), folder
        try:
            self.view.apply_all(load_run_events(folder))
        except RunFolderError as exc:
            self._notice("error", str(exc))
            self.notify(str(exc), severity="error", markup=False, timeout=10)
            return
        self._open_read_only_if_held()
        self._refresh_all()
        if self.read_only_pid is None:
            self.start_engine()
