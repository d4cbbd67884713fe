"""Screens over the dashboard: trace and transcript viewers, paired traces, the help list, a y/n
confirm, a reason prompt and the steer note."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from whale_lab.trace import EpisodeTrace
from whale_lab.tui import pack_render, render


class TraceScreen(Screen[None]):
    """One episode in full: every message, response, parsed action, observation and feedback."""

    BINDINGS = [
        Binding("escape,q", "close", "Close", id="trace.close"),
        Binding("home", "scroll('home')", "Top", show=False),
        Binding("end", "scroll('end')", "Bottom", show=False),
    ]

    def __init__(self, trace: EpisodeTrace, title: str) -> None:
        super().__init__()
        self.trace = trace
        self.title_text = title

    def compose(self) -> ComposeResult:
        yield Static(Text(self.title_text, style="bold reverse", no_wrap=True), id="trace-title")
        with VerticalScroll(id="trace-body"):
            yield Static(render.trace_text(self.trace), id="trace-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#trace-body").focus()

    def action_close(self) -> None:
        self.dismiss()

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#trace-body", VerticalScroll)
        if where == "home":
            body.scroll_home(animate=False)
        else:
            body.scroll_end(animate=False)


class ConfirmScreen(ModalScreen[bool]):
    """A y/n question; Escape means no."""

    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-dialog", classes="dialog"):
            yield Label(Text(self.question), id="confirm-question")
            with Horizontal(classes="dialog-buttons"):
                yield Button(Text("Yes (y)"), id="confirm-yes", variant="error", compact=True)
                yield Button(Text("No (n)"), id="confirm-no", variant="primary", compact=True)

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class ReasonScreen(ModalScreen["str | None"]):
    """Ask for a non-empty reason (a rejection must say why); Escape cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="reason.cancel")]

    def __init__(self, prompt: str) -> None:
        super().__init__()
        self.prompt = prompt

    def compose(self) -> ComposeResult:
        with Vertical(id="reason-dialog", classes="dialog"):
            yield Label(Text(self.prompt), id="reason-prompt")
            yield Input(placeholder="why? (Enter to submit, Escape to cancel)", id="reason-input")
            yield Label("", id="reason-error")

    def on_mount(self) -> None:
        self.query_one("#reason-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        reason = event.value.strip()
        if not reason:
            self.query_one("#reason-error", Label).update(
                Text("a reason is required", style="bold red")
            )
            return
        self.dismiss(reason)

    def action_cancel(self) -> None:
        self.dismiss(None)


class StoppingScreen(ModalScreen[None]):
    """Shown while the engine winds down; pressing the quit key again leaves at once."""

    BINDINGS = [Binding("q,ctrl+c", "force", "Quit now", id="stopping.force")]

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical(id="stopping-dialog", classes="dialog"):
            yield Label(Text(self.message), id="stopping-message")
            yield Label(
                Text("press q again to quit now (the run folder can be resumed)", style="dim")
            )

    def action_force(self) -> None:
        from whale_lab.tui.app import WhaleLabApp

        app = self.app
        if isinstance(app, WhaleLabApp):
            app.force_exit()
        else:  # pragma: no cover
            app.exit()


class HelpScreen(ModalScreen[None]):
    """Every binding: key (after the keymap), what it does, its id, and whether it applies now."""

    BINDINGS = [Binding("escape,q,question_mark,f1", "close", "Close", id="help.close")]

    def __init__(self, rows: list[tuple[str, str, str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog", classes="dialog"):
            yield Label(
                Text("Keys (remap by id in a keymap file: see WHALE_LAB_KEYMAP)", style="bold")
            )
            table: DataTable[Text] = DataTable(id="help-table", cursor_type="row")
            table.add_columns("key", "action", "id", "now")
            for key, desc, bid, state in self.rows:
                style = "" if state == "enabled" else "dim"
                table.add_row(
                    Text(key, style="bold"),
                    Text(desc, style=style),
                    Text(bid),
                    Text(state, style=style),
                )
            yield table
            yield Label(
                Text(
                    "ctrl+p: command palette · Enter on a rollout: its trace · Enter on a paired "
                    "task (Review): both traces · Escape: close",
                    style="dim",
                )
            )

    def on_mount(self) -> None:
        self.query_one("#help-table", DataTable).focus()

    def action_close(self) -> None:
        self.dismiss()


class TranscriptScreen(Screen[None]):
    """A proposer session in full (each text cut for the screen; the archive keeps the rest)."""

    BINDINGS = [
        Binding("escape,q", "close", "Close", id="transcript.close"),
        Binding("home", "scroll('home')", "Top", show=False),
        Binding("end", "scroll('end')", "Bottom", show=False),
    ]

    def __init__(self, transcript: dict[str, Any], title: str) -> None:
        super().__init__()
        self.transcript = transcript
        self.title_text = title

    def compose(self) -> ComposeResult:
        yield Static(Text(self.title_text, style="bold reverse", no_wrap=True), id="trace-title")
        with VerticalScroll(id="transcript-body"):
            yield Static(pack_render.transcript_text(self.transcript), id="transcript-text")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#transcript-body").focus()

    def action_close(self) -> None:
        self.dismiss()

    def action_scroll(self, where: str) -> None:
        body = self.query_one("#transcript-body", VerticalScroll)
        if where == "home":
            body.scroll_home(animate=False)
        else:
            body.scroll_end(animate=False)


class PairedTraceScreen(Screen[None]):
    """One task under the incoming harness (left) and the candidate (right), side by side."""

    DEFAULT_CSS = """
    PairedTraceScreen #paired-body { height: 1fr; }
    PairedTraceScreen .paired-side { width: 1fr; height: 1fr; padding: 0 1; }
    PairedTraceScreen .paired-head { height: 1; }
    """
    BINDINGS = [
        Binding("escape,q", "close", "Close", id="paired.close"),
        Binding("tab", "other_side", "Other side", id="paired.other"),
    ]

    def __init__(
        self,
        left: EpisodeTrace | None,
        right: EpisodeTrace | None,
        titles: tuple[str, str, str],
    ) -> None:
        super().__init__()
        self.left, self.right = left, right
        self.titles = titles

    def compose(self) -> ComposeResult:
        title, left_title, right_title = self.titles
        yield Static(Text(title, style="bold reverse", no_wrap=True), id="trace-title")
        with Horizontal(id="paired-body"):
            for side, trace, head in (
                ("left", self.left, left_title),
                ("right", self.right, right_title),
            ):
                with Vertical(classes="paired-side"):
                    yield Static(Text(head, style="bold", no_wrap=True), classes="paired-head")
                    with VerticalScroll(id=f"paired-{side}"):
                        body = (
                            render.trace_text(trace)
                            if trace is not None
                            else Text("no episode of this task recorded", style="dim")
                        )
                        yield Static(body)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#paired-left").focus()

    def action_other_side(self) -> None:
        left = self.query_one("#paired-left")
        (self.query_one("#paired-right") if left.has_focus else left).focus()

    def action_close(self) -> None:
        self.dismiss()


class SteerScreen(ModalScreen["str | None"]):
    """Write a steer note: a request in words for the next proposer session; Escape cancels.

    Below the input, the notes written so far and where each went (the app keeps that list).
    """

    DEFAULT_CSS = """
    SteerScreen #steer-dialog { width: 90%; max-width: 110; height: auto; max-height: 90%; }
    SteerScreen #steer-history { height: auto; max-height: 12; }
    """
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="steer.cancel")]

    def __init__(self, where: str, history: Text) -> None:
        super().__init__()
        self.where = where
        self.history = history

    def compose(self) -> ComposeResult:
        with Vertical(id="steer-dialog", classes="dialog"):
            yield Label(Text("Steer note for the next proposer session", style="bold"))
            yield Label(Text(self.where, style="dim"), id="steer-where")
            yield Input(
                placeholder="e.g. show the passage titles (Enter to send, Escape to cancel)",
                id="steer-input",
            )
            yield Label("", id="steer-error")
            with VerticalScroll(id="steer-history"):
                yield Static(self.history, id="steer-history-text")

    def on_mount(self) -> None:
        self.query_one("#steer-input", Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        from whale_lab.search.steering import check_note

        try:
            text = check_note(event.value)
        except ValueError as exc:
            self.query_one("#steer-error", Label).update(Text(str(exc), style="bold red"))
            return
        self.dismiss(text)

    def action_cancel(self) -> None:
        self.dismiss(None)
