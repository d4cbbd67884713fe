"""One-line views redraw without laying the screen out again; anything else still does."""

from __future__ import annotations

from rich.text import Text
from textual.app import App, ComposeResult

from whale_lab.tui.widgets import TextView


class ViewsApp(App[None]):
    CSS = "#line { height: 1; }"

    def compose(self) -> ComposeResult:
        yield TextView(id="line", one_line=True)
        yield TextView(id="free")


async def test_a_one_line_update_redraws_the_view_without_a_layout_pass() -> None:
    app = ViewsApp()
    async with app.run_test(size=(60, 10)) as pilot:
        line = app.query_one("#line", TextView)
        free = app.query_one("#free", TextView)
        await pilot.pause()
        line.show(Text("⏱ 00:01"))
        assert not line._layout_required  # redrawn alone
        await pilot.pause()
        assert "00:01" in str(line.render())
        line.show(Text("two\nlines"))  # not one line after all: the layout decides
        assert line._layout_required
        await pilot.pause()
        free.show(Text("anything"))  # a view not held to one line always asks for layout
        assert free._layout_required
        await pilot.pause()
        line.show("⏱ 00:02")
        assert not line._layout_required
        await pilot.pause()
        assert "00:02" in str(line.render())
