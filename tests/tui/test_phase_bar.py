"""The header's progress bar: an unknown amount of work draws a still bar, not a sweep that
redraws fifteen times a second; a known amount draws its share."""

from __future__ import annotations

from textual.app import App, ComposeResult

from whale_lab.tui.widgets import PhaseProgressBar, StillBar


class BarApp(App[None]):
    def compose(self) -> ComposeResult:
        yield PhaseProgressBar(total=None, show_eta=False, id="phase-progress")


async def test_an_unknown_amount_draws_a_still_bar_that_schedules_no_redraws() -> None:
    app = BarApp()
    async with app.run_test(size=(60, 3)) as pilot:
        progress = app.query_one(PhaseProgressBar)
        bar = app.query_one(StillBar)
        await pilot.pause()
        assert bar.percentage is None
        assert bar.auto_refresh is None  # Textual's own bar sets 1/15 here
        first = [strip.text for strip in bar.render_lines(bar.region.reset_offset)]
        await pilot.pause(0.3)  # a sweep moves 30 cells a second
        assert [strip.text for strip in bar.render_lines(bar.region.reset_offset)] == first
        assert first[0].strip()  # drawn across its width, not blank

        progress.update(total=10, progress=5)
        await pilot.pause()
        assert bar.percentage == 0.5
        assert bar.auto_refresh is None
        half = bar.render_lines(bar.region.reset_offset)[0]
        styles = {seg.style for seg in half}
        assert len(styles) >= 2  # a done part and a part to go

        progress.update(total=None, progress=0)
        await pilot.pause()
        assert bar.auto_refresh is None
