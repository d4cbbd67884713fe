"""Screens over the dashboard: a trace viewer, the help list, a y/n confirm and a reason prompt."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Static

from whale_lab.trace import EpisodeTrace
from whale_lab.tui import render


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
                    "ctrl+p: command palette · Enter on a rollout: open its trace · Escape: close",
                    style="dim",
                )
            )

    def on_mount(self) -> None:
        self.query_one("#help-table", DataTable).focus()

    def action_close(self) -> None:
        self.dismiss()
