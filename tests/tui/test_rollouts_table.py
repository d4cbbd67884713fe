"""The live rollouts table: trimmed past its cap with slack, a moved cursor kept across a trim,
and cells drawn from the rows they belong to after a trim."""

from __future__ import annotations

from textual.app import App, ComposeResult

from whale_lab.events import EpisodeFinished, RunStarted
from whale_lab.tui import widgets
from whale_lab.tui.state import RunView
from whale_lab.tui.widgets import RolloutsPanel, RolloutsTable


class PanelApp(App[None]):
    def compose(self) -> ComposeResult:
        yield RolloutsPanel(id="rollouts-panel")


def _episode(i: int, task_id: str = "") -> EpisodeFinished:
    return EpisodeFinished(
        phase="weight",
        task_id=task_id or f"t{i}",
        sample=0,
        turns=1,
        reward=float(i % 2),
        stop_reason="answered",
    )


async def test_trim_with_slack_keeps_a_moved_cursor(monkeypatch) -> None:
    monkeypatch.setattr(widgets, "MAX_TABLE_ROWS", 10)
    monkeypatch.setattr(widgets, "TABLE_SLACK", 5)
    view = RunView()
    view.apply(RunStarted(run_id="r", domain="math", model="m", schedule="whale", harness="h0"))
    app = PanelApp()
    async with app.run_test(size=(100, 20)) as pilot:
        panel = app.query_one(RolloutsPanel)
        table = app.query_one("#rollouts-table", RolloutsTable)
        view.apply_all([_episode(i) for i in range(12)])
        panel.update_view(view)
        await pilot.pause()
        assert table.row_count == 12  # within the slack: appended, not trimmed
        assert table.cursor_row == 11  # follows the newest row
        table.move_cursor(row=8)
        await pilot.pause()
        view.apply_all([_episode(i) for i in range(12, 17)])
        panel.update_view(view)
        await pilot.pause()
        # past cap + slack: back to the newest 10, the cursor still on the episode it was on
        assert table.row_count == 10
        assert [r.index for r in panel._shown] == list(range(7, 17))
        row = panel.selected_row()
        assert row is not None and row.index == 8
        assert table.cursor_row == 1
        # what is drawn is the rows now in the table, not cells cached before the trim
        assert [str(table.get_row_at(i)[0]) for i in range(10)] == [
            str(i + 1) for i in range(7, 17)
        ]
        drawn = "\n".join(line.text for line in table.render_lines(table.region.reset_offset))
        assert " t7 " in drawn and " t16 " in drawn and " t6 " not in drawn



class TableApp(App[None]):
    def compose(self) -> ComposeResult:
        from whale_lab.tui import render

        table = RolloutsTable(id="kept", cursor_type="row", zebra_stripes=True)
        table.add_columns(*render.EPISODE_COLUMNS)
        table.styles.height = 12
        yield table


async def test_kept_lines_draw_what_a_fresh_render_draws_as_rows_stream_in() -> None:
    """Appends with the cursor following the newest row, a cursor moved up, focus lost and
    back, a wider cell: after each, every visible line drawn through the kept lines equals the
    same line drawn with every cache emptied."""
    from whale_lab.tui import render

    view = RunView()
    view.apply(RunStarted(run_id="r", domain="math", model="m", schedule="whale", harness="h0"))
    app = TableApp()
    async with app.run_test(size=(110, 30)) as pilot:
        table = app.query_one("#kept", RolloutsTable)
        table.focus()
        hits = 0

        def lines() -> list[str]:
            return [
                "".join(f"{seg.text}|{seg.style}" for seg in strip)
                for strip in table.render_lines(table.region.reset_offset)
            ]

        async def same() -> None:
            nonlocal hits
            await pilot.pause()
            before = len(table._kept_lines)
            drawn = lines()
            hits += before > 0 and len(table._kept_lines) == before  # every line came kept
            table._clear_caches()
            assert drawn == lines()

        async def append(episodes: list[EpisodeFinished], follow: bool = True) -> None:
            for ep in episodes:
                view.apply(ep)
                table.add_row(*render.episode_cells(view.episodes[-1]))
            if follow:
                table.move_cursor(row=table.row_count - 1, animate=False)
            await pilot.pause()
            lines()  # the redraw after the append fills the kept lines
            table.add_row(*render.episode_cells(view.episodes[-1]))  # one more: a new count
            await same()

        for start in range(0, 30, 3):
            await append([_episode(i) for i in range(start, start + 3)])
        table.move_cursor(row=20, animate=False)
        await same()
        await append([_episode(i) for i in range(30, 34)], follow=False)
        table.move_cursor(row=table.row_count - 1, animate=False)
        await same()
        app.set_focus(None)
        await same()
        table.focus()
        await same()
        await append([_episode(34, task_id="a-task-id-much-wider-than-the-others")])
        assert hits > 0  # lines were drawn from the kept cache, not around it
