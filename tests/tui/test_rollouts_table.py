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
                "".join(f"{seg.text}|{seg.style!r}|{seg.style and seg.style.meta}" for seg in strip)
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


class TwinApp(App[None]):
    """DataTable and RolloutsTable side by side with the same columns and rows."""

    def compose(self) -> ComposeResult:
        from textual.widgets import DataTable

        from whale_lab.tui import render

        for table in (
            DataTable(id="plain", cursor_type="row", zebra_stripes=True),
            RolloutsTable(id="kept", cursor_type="row", zebra_stripes=True),
        ):
            table.add_columns(*render.EPISODE_COLUMNS)
            table.styles.height = 14
            yield table


async def test_cells_drawn_from_kept_looks_equal_datatables_own_drawing() -> None:
    """Every segment RolloutsTable draws (text, colours, attributes and the row/column meta a
    click reads) equals DataTable's own, with the cursor on a row, off it, hovered and unfocused,
    and with cells repeating across rows so the kept looks are reused."""
    from textual.coordinate import Coordinate
    from textual.widgets import DataTable

    from whale_lab.tui import render

    view = RunView()
    view.apply(RunStarted(run_id="r", domain="math", model="m", schedule="whale", harness="h0"))
    for i in range(24):
        view.apply(_episode(i, task_id="a-much-wider-task-id" if i == 17 else ""))
    app = TwinApp()
    async with app.run_test(size=(110, 40)) as pilot:
        plain = app.query_one("#plain", DataTable)
        kept = app.query_one("#kept", RolloutsTable)
        for row in view.episodes:
            for table in (plain, kept):
                table.add_row(*render.episode_cells(row))

        def drawn(table: DataTable) -> list[list[tuple[object, ...]]]:
            return [
                [(s.text, s.style, s.style and s.style.meta, s.control) for s in strip]
                for strip in table.render_lines(table.region.reset_offset)
            ]

        async def same() -> None:
            """Each table drawn focused (one at a time) and unfocused: the two alike."""
            a: list[object] = []
            b: list[object] = []
            for focus in (plain, kept, None):
                app.set_focus(focus)
                await pilot.pause()
                a.append(drawn(plain) if focus is not kept else None)
                b.append(drawn(kept) if focus is not plain else None)
            assert (a[0], a[2]) == (b[1], b[2])
            assert any(s[2] and s[2].get("row", -1) >= 0 for line in b[1] for s in line)

        for row in (23, 5, 0):
            for table in (plain, kept):
                table.move_cursor(row=row, animate=False)
            await same()
        for table in (plain, kept):
            table.hover_coordinate = Coordinate(2, 2)
            table._set_hover_cursor(True)
        await same()
    assert len(kept._kept_looks) < 9 * len(view.episodes)  # repeated cells drawn once


async def test_a_smaller_window_keeps_the_cursor_row_in_sight() -> None:
    """At 120x40 the cursor sits near the bottom of the window; shrunk to 80x24, the table
    scrolls so that row is still drawn (DataTable alone scrolls only when the cursor moves)."""
    from whale_lab.tui import render

    view = RunView()
    view.apply(RunStarted(run_id="r", domain="math", model="m", schedule="whale", harness="h0"))
    for i in range(80):
        view.apply(_episode(i))
    app = PanelApp()
    async with app.run_test(size=(120, 40)) as pilot:
        table = app.query_one("#rollouts-table", RolloutsTable)
        table.append_rows([render.episode_cells(row) for row in view.episodes])
        table.move_cursor(row=60, animate=False)
        await pilot.pause()
        table.move_cursor(row=table.scroll_y + table.size.height - 3, animate=False)
        await pilot.pause()
        row = table.cursor_row
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.pause()
        drawn = "\n".join(s.text for s in table.render_lines(table.region.reset_offset))
        assert f" {row + 1} " in drawn, (row, table.scroll_y, table.size)
