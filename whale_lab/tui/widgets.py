"""The panels: each one redraws itself from the view model when the app says its area changed."""

from __future__ import annotations

from typing import Any

from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text
from textual import events
from textual.app import ComposeResult, RenderResult
from textual.cache import LRUCache
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.geometry import Region
from textual.renderables.styled import Styled
from textual.strip import Strip
from textual.widgets import (
    Button,
    DataTable,
    OptionList,
    ProgressBar,
    RichLog,
    Static,
)
from textual.widgets._progress_bar import Bar, PercentageStatus
from textual.widgets.option_list import Option
from textual_plotext import PlotextPlot

from whale_lab.tui import pack_render, plots, render
from whale_lab.tui.review_pack import PairedTask, ReviewPack
from whale_lab.tui.state import EpisodeRow, ReviewEntry, RunView, filter_label, matches_filter

MAX_TABLE_ROWS = 1_000
#: Rows the live rollouts table may grow past `MAX_TABLE_ROWS` before it is trimmed back to
#: the newest `MAX_TABLE_ROWS`: a trim re-adds every row, so it runs once per `TABLE_SLACK`
#: episodes rather than on every redraw once the cap is reached.
TABLE_SLACK = 500


class TextView(Static):
    """A Static that skips updates that would not change what it shows (redraws are costly).

    With `one_line`, for a view the stylesheet holds to one unwrapped line whose width its
    container sets (the header's lines, the summaries above the tables), a one-line update
    cannot change its size, so it redraws the view alone: an update that may change a size makes
    Textual lay out the whole screen again, and the header's clock changes every second."""

    def __init__(self, *args: Any, one_line: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shown_key: object = object()
        self._one_line = one_line

    def show(self, renderable: Any, key: object = None) -> None:
        key = renderable if key is None else key
        if isinstance(key, Text):
            key = (key.plain, tuple(key.spans), str(key.style))
        if key == self._shown_key:
            return
        self._shown_key = key
        self.update(renderable, layout=not (self._one_line and _one_line(renderable)))


def _one_line(renderable: Any) -> bool:
    if isinstance(renderable, Text):
        return "\n" not in renderable.plain
    return isinstance(renderable, str) and "\n" not in renderable


class StillBar(Bar):
    """Textual's bar without its sweep while the amount of work is unknown.

    The sweep redraws fifteen times a second for as long as it lasts (loading the model, a
    phase's start), the UI thread's largest cost while nothing else changes; the header's clock
    and activity already say the engine is at work, so an unknown amount shows as a still bar."""

    def watch_percentage(self, percentage: float | None) -> None:
        self.auto_refresh = None

    def render_indeterminate(self) -> RenderResult:
        style = self.get_component_rich_style("bar--indeterminate")
        return self.bar_renderable(
            highlight_range=(0, self.size.width),
            highlight_style=Style.from_color(style.color),
            background_style=Style.from_color(style.bgcolor),
        )


class PhaseProgressBar(ProgressBar):
    """The header's progress bar, with the still bar for an unknown amount (no ETA)."""

    def compose(self) -> ComposeResult:
        yield (
            StillBar(id="bar", clock=self._clock, bar_renderable=self.BAR_RENDERABLE)
            .data_bind(ProgressBar.percentage)
            .data_bind(ProgressBar.gradient)
        )
        if self.show_percentage:
            yield PercentageStatus(id="percentage").data_bind(ProgressBar.percentage)


class StatusPanel(Vertical):
    """Header: run, model, domain, schedule, cycle/phase with its budget, rollouts, spend."""

    def compose(self) -> ComposeResult:
        yield TextView(id="status-run", one_line=True)
        with Horizontal(id="status-phase"):
            yield TextView(id="status-phase-label", one_line=True)
            yield PhaseProgressBar(total=None, show_eta=False, id="phase-progress")
            yield TextView(id="status-elapsed", one_line=True)
        yield TextView(id="status-accounting", one_line=True)

    def update_view(
        self, view: RunView, *, state: str, fallback: dict[str, str], elapsed: float
    ) -> None:
        self.query_one("#status-run", TextView).show(
            render.status_line(view, state=state, fallback=fallback)
        )
        self.query_one("#status-phase-label", TextView).show(render.phase_label(view))
        bar = self.query_one("#phase-progress", ProgressBar)
        act = view.activity.activity
        if view.phase_budget > 0:
            bar.update(total=view.phase_budget, progress=min(view.phase_done, view.phase_budget))
        elif act is not None and act.total > 0:
            # before the first phase (the start evaluation) the bar follows the scoring the
            # header names (`val 96/256`) rather than animating as if nothing were measured
            bar.update(total=act.total, progress=min(act.done, act.total))
        else:
            bar.update(total=None, progress=0)
        self.query_one("#status-elapsed", TextView).show(
            Text(f"⏱ {render.fmt_duration(elapsed)}", no_wrap=True)
        )
        self.query_one("#status-accounting", TextView).show(render.accounting_line(view))


class RolloutsTable(DataTable[Text]):
    """The live rollouts table: a DataTable whose rendered cells survive appends.

    DataTable keys its cell and line caches on a counter every `add_row` bumps, and its line
    cache on the cursor's position too, so each redraw while episodes stream in (the cursor
    following the newest row) re-renders every visible line. Rows here are only ever appended
    (a trim clears and re-adds), so a cell's look depends only on its row, column, position
    and width, and a line's on its row, the column widths and whether the cursor or the hover
    is on that row: those key second caches that appends leave alone. Anything that clears
    DataTable's caches (clear, styles, theme) clears these too, so row keys, which hash by
    identity, are never reused across them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kept_cells: LRUCache[tuple[object, ...], Any] = LRUCache(4000)
        self._kept_lines: LRUCache[tuple[object, ...], Strip] = LRUCache(1000)
        self._kept_looks: LRUCache[tuple[object, ...], Any] = LRUCache(4000)
        self._frame_style: Style | None = None
        self._frame_widths: tuple[int, ...] = ()

    def _clear_caches(self) -> None:
        super()._clear_caches()
        if hasattr(self, "_kept_cells"):
            self._kept_cells.clear()
            self._kept_lines.clear()
            self._kept_looks.clear()

    def on_resize(self, event: events.Resize) -> None:
        """A smaller window keeps the row under the cursor in sight (DataTable scrolls to the
        cursor only when it moves, so after a shrink it could sit below the window's edge)."""
        if self.row_count and self.cursor_type == "row":
            self.call_after_refresh(self._scroll_cursor_into_view)

    def append_rows(self, rows: list[tuple[Text, ...]]) -> None:
        """Add rows and measure them now rather than when the table next idles.

        DataTable measures new rows on idle, so an append followed by a move to the newest row
        draws three frames (the rows, the scroll clamped to the old size, the new size and
        scroll); measured here, the append, the new size and the scroll are one frame."""
        self.add_rows(rows)
        if self._require_update_dimensions:
            self._require_update_dimensions = False
            new_rows = self._new_rows.copy()
            self._new_rows.clear()
            self._update_dimensions(new_rows)

    def _column_widths(self) -> tuple[int, ...]:
        return tuple(column.get_render_width(self) for column in self.ordered_columns)

    def render_lines(self, crop: Region) -> list[Strip]:
        # What every line of one frame shares is worked out once for the frame: the widget's
        # style and the column widths (each a walk over styles or columns per line otherwise).
        self._frame_style = self.rich_style
        self._frame_widths = self._column_widths()
        try:
            return super().render_lines(crop)
        finally:
            self._frame_style = None
            self._frame_widths = ()

    def render_line(self, y: int) -> Strip:
        if self.fixed_rows:
            return super().render_line(y)
        scroll_x, scroll_y = self.scroll_offset
        if y >= (self.get_row_height(self._header_row_key) if self.show_header else 0):
            y += scroll_y
        style = self._frame_style if self._frame_style is not None else self.rich_style
        return self._render_line(y, scroll_x, scroll_x + self.size.width, style)

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        if self.cursor_type != "row" or self.fixed_columns or self._labelled_row_exists:
            return super()._render_line(y, x1, x2, base_style)  # not this table's shape
        try:
            row_key, line_no = self._get_offsets(y)
        except LookupError:
            return super()._render_line(y, x1, x2, base_style)
        found = self._row_locations.get(row_key)
        row_index = -1 if found is None else found  # -1: the header
        key = (
            row_key,
            row_index,
            line_no,
            x1,
            x2,
            self.size.width,
            base_style,
            self.show_cursor,
            self.cursor_coordinate.row == row_index,
            self.hover_coordinate.row == row_index,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self._frame_widths or self._column_widths(),
        )
        strip = self._kept_lines.get(key)
        if strip is None:
            strip = super()._render_line(y, x1, x2, base_style)
            self._kept_lines[key] = strip
        return strip

    def _render_cell(
        self,
        row_index: int,
        column_index: int,
        base_style: Style,
        width: int,
        cursor: bool = False,
        hover: bool = False,
    ) -> Any:
        if row_index < 0 or column_index < 0:  # header and labels: DataTable's own cache
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        key = (
            self._row_locations.get_key(row_index),
            row_index,
            column_index,
            base_style,
            width,
            cursor,
            hover,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
        )
        lines = self._kept_cells.get(key)
        if lines is None:
            lines = self._render_body_cell(
                row_index, column_index, base_style, width, cursor, hover
            )
            self._kept_cells[key] = lines
        return lines

    def _render_body_cell(
        self, row_index: int, column_index: int, base_style: Style, width: int, cursor: bool,
        hover: bool,
    ) -> Any:
        """A one-line text cell drawn from the kept drawing of the same text, width and styles.

        Most columns repeat (phase, turns, stop reason, harness), so each distinct look is drawn
        once through Rich and later rows only add their own position: the `row`/`column` meta
        DataTable puts on every segment for the mouse, which carries no colour or attribute, so
        adding it last gives the same segments as DataTable's own drawing with it first."""
        row = self.rows.get(self._row_locations.get_key(row_index))  # type: ignore[arg-type]
        cells = self._get_row_renderables(row_index).cells
        cell = cells[column_index] if column_index < len(cells) else None
        if (
            row is None or row.height != 1 or not isinstance(cell, Text) or "\n" in cell.plain
            or row_index < self.fixed_rows or column_index < self.fixed_columns
        ):
            return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)
        component_style, post_style = self._get_styles_to_render_cell(
            False, False, False, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css",
        )
        look = (
            cell.plain, str(cell.style), tuple(cell.spans), cell.justify, cell.overflow,
            cell.no_wrap, cell.end, width, base_style, component_style, post_style,
            self.cell_padding,
        )
        body = self._kept_looks.get(look)
        if body is None:
            options = self.app.console_options.update_dimensions(width, 1).update(no_wrap=True)
            body = self.app.console.render_lines(
                Styled(
                    Padding(cell, (0, self.cell_padding)),
                    pre_style=base_style + component_style,
                    post_style=post_style,
                ),
                options,
            )
            self._kept_looks[look] = body
        meta = Style.from_meta({"row": row_index, "column": column_index})
        return [
            [Segment(seg.text, meta if seg.style is None else seg.style + meta, seg.control)
             for seg in line]
            for line in body
        ]


class RolloutsPanel(Vertical):
    """Finished episodes, newest at the bottom, coloured by outcome and filterable."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.filter = "all"
        self._shown: list[EpisodeRow] = []
        self._last_index = -1

    def compose(self) -> ComposeResult:
        yield TextView(id="rollouts-summary", one_line=True)
        table = RolloutsTable(id="rollouts-table", cursor_type="row", zebra_stripes=True)
        table.add_columns(*render.EPISODE_COLUMNS)
        yield table

    @property
    def table(self) -> RolloutsTable:
        return self.query_one("#rollouts-table", RolloutsTable)

    def filters(self, view: RunView) -> list[str]:
        """All, failures, then one entry per stop reason seen so far."""
        return ["all", "failures"] + [f"stop:{r}" for r in sorted(view.stop_counts)]

    def set_filter(self, flt: str, view: RunView) -> None:
        self.filter = flt
        self.rebuild(view)

    def selected_row(self) -> EpisodeRow | None:
        table = self.table
        if not self._shown or table.row_count == 0:
            return None
        idx = table.cursor_row
        if 0 <= idx < len(self._shown):
            return self._shown[idx]
        return None

    def rebuild(self, view: RunView, follow: bool = True) -> None:
        """Redraw the table from the view: the newest `MAX_TABLE_ROWS` rows the filter keeps.
        The cursor goes to the newest row, or with `follow` false stays on the row it was on
        (the first row when that one was trimmed)."""
        table = self.table
        keep = None if follow else self.selected_row()
        table.clear()
        rows = [r for r in view.episodes if matches_filter(r, self.filter)][-MAX_TABLE_ROWS:]
        self._shown = rows
        table.append_rows([render.episode_cells(row) for row in rows])
        self._last_index = view.episodes[-1].index if view.episodes else -1
        if rows:
            target = len(rows) - 1
            if keep is not None:
                target = next((i for i, r in enumerate(rows) if r.index == keep.index), 0)
            table.move_cursor(row=target, animate=False)
        self._update_summary(view)

    def update_view(self, view: RunView) -> None:
        """Append episodes that arrived since the last call (one batch per flush); past the cap
        and its slack, trim back to the newest `MAX_TABLE_ROWS`."""
        table = self.table
        follow = table.row_count == 0 or table.cursor_row >= table.row_count - 1
        new = [r for r in view.episodes if r.index > self._last_index]
        if view.episodes:
            self._last_index = view.episodes[-1].index
        added = [r for r in new if matches_filter(r, self.filter)]
        if len(self._shown) + len(added) > MAX_TABLE_ROWS + TABLE_SLACK:
            self.rebuild(view, follow=follow)
            return
        if added:
            table.append_rows([render.episode_cells(row) for row in added])
            self._shown.extend(added)
            if follow:
                table.move_cursor(row=table.row_count - 1, animate=False)
        self._update_summary(view)

    def _update_summary(self, view: RunView) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("filter ", style="dim")
        t.append(filter_label(self.filter), style="bold reverse")
        t.append(
            f"  {render.fmt_int(len(self._shown))} shown of {render.fmt_int(view.episode_count)}  ",
            style="dim",
        )
        t.append_text(render.outcome_summary(view))
        self.query_one("#rollouts-summary", TextView).show(t)


class AccuracyPanel(Vertical):
    """Val/test mean@k against rollouts (phases marked), candidate scores per iteration (the
    accepted one marked), the weight phase's reward and accept rate per step, the cycle table."""

    DEFAULT_CSS = """
    AccuracyPanel #accuracy-plot { height: 2fr; min-height: 6; }
    AccuracyPanel #accuracy-lower { height: 1fr; min-height: 5; }
    AccuracyPanel #candidates-plot, AccuracyPanel #training-plot { width: 1fr; height: 1fr; }
    """

    def compose(self) -> ComposeResult:
        yield TextView(id="accuracy-summary", one_line=True)
        yield PlotextPlot(id="accuracy-plot")
        with Horizontal(id="accuracy-lower"):
            yield PlotextPlot(id="candidates-plot")
            yield PlotextPlot(id="training-plot")
        table: DataTable[Text] = DataTable(id="cycles-table", cursor_type="row")
        table.add_columns(*render.CYCLE_COLUMNS)
        yield table

    def update_view(self, view: RunView) -> None:
        self.query_one("#accuracy-summary", TextView).show(render.accuracy_summary(view))
        for selector, draw in (
            ("#accuracy-plot", plots.draw_accuracy),
            ("#candidates-plot", plots.draw_candidates),
            ("#training-plot", plots.draw_training),
        ):
            widget = self.query_one(selector, PlotextPlot)
            widget.plt.clear_data()
            widget.plt.clear_figure()
            draw(widget.plt, view)
            widget.refresh()
        table = self.query_one("#cycles-table", DataTable)
        table.clear()
        for cyc in sorted(view.cycles):
            table.add_row(*render.cycle_cells(view.cycles[cyc]))


class ReviewPanel(Vertical):
    """Candidates awaiting a decision (first) and recent decisions; for the selected one its
    review pack (paired fixes and breaks against the incoming harness, noise floor, smoke, what
    the proposer read) and its diff. Enter on a paired task opens both traces side by side."""

    DEFAULT_CSS = """
    ReviewPanel #review-pack { height: auto; }
    ReviewPanel #review-pairs { height: auto; max-height: 8; margin: 0 0 1 0; }
    """

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._ids: list[str] = []
        self._signature: tuple[object, ...] = ()
        self._entries: list[ReviewEntry] = []
        self._live: set[str] = set()
        self._pairs: list[PairedTask] = []
        self._pairs_key: object = None
        self.pack: ReviewPack | None = None

    def compose(self) -> ComposeResult:
        yield OptionList(id="review-list")
        with VerticalScroll(id="review-detail"):
            yield TextView(id="review-meta")
            yield TextView(id="review-pack")
            pairs: DataTable[Text] = DataTable(id="review-pairs", cursor_type="row")
            pairs.add_columns(*pack_render.PAIR_COLUMNS)
            yield pairs
            yield TextView(id="review-diff")

    def selected_id(self) -> str | None:
        ol = self.query_one("#review-list", OptionList)
        idx = ol.highlighted
        if idx is None or not (0 <= idx < len(self._ids)):
            return None
        return self._ids[idx]

    def selected_entry(self) -> ReviewEntry | None:
        cid = self.selected_id()
        return next((e for e in self._entries if e.candidate_id == cid), None)

    def selected_pair(self) -> PairedTask | None:
        table = self.query_one("#review-pairs", DataTable)
        idx = table.cursor_row
        return self._pairs[idx] if self._pairs and 0 <= idx < len(self._pairs) else None

    def update_view(self, entries: list[ReviewEntry], live_ids: set[str]) -> None:
        """`entries`: pending first; `live_ids`: those an engine is waiting on right now."""
        self._entries, self._live = entries, set(live_ids)
        signature = tuple((e.candidate_id, e.status, e.candidate_id in live_ids) for e in entries)
        ol = self.query_one("#review-list", OptionList)
        if signature != self._signature:
            keep = self.selected_id()
            self._signature = signature
            self._ids = [e.candidate_id for e in entries]
            ol.clear_options()
            ol.add_options(
                [
                    Option(
                        render.review_option(e, live=e.candidate_id in live_ids), id=e.candidate_id
                    )
                    for e in entries
                ]
            )
            if self._ids:
                # stay on the selected candidate while it still waits; else the first waiting one
                still = keep in self._ids and entries[self._ids.index(keep)].status == "pending"
                ol.highlighted = self._ids.index(keep) if still else 0
        self.show_selected(entries, live_ids)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if self.is_mounted:
            self.show_selected(self._entries, self._live)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.data_table.id == "review-pairs":
            event.stop()
            self.app.call_later(self.app.run_action, "open_pair")

    def show_selected(self, entries: list[ReviewEntry], live_ids: set[str]) -> None:
        cid = self.selected_id()
        entry = next((e for e in entries if e.candidate_id == cid), None)
        meta = self.query_one("#review-meta", TextView)
        diff = self.query_one("#review-diff", TextView)
        if entry is None:
            meta.show(Text("No candidates to review.", style="dim"))
            self._show_pack(None)
            diff.show(Text(""))
            return
        meta.show(render.review_meta(entry, live=entry.candidate_id in live_ids))
        provider = getattr(self.app, "review_pack", None)
        self._show_pack(provider(entry) if callable(provider) else None, entry.noise_floor)
        if entry.diff.strip():
            diff.show(
                Syntax(entry.diff, "diff", theme="ansi_dark", word_wrap=True),
                key=("diff", entry.diff),
            )
        else:
            diff.show(Text("(no diff recorded)", style="dim"))

    def _show_pack(self, pack: ReviewPack | None, shown_floor: str = "") -> None:
        self.pack = pack
        key_of = getattr(self.app, "binding_key", None)
        key = key_of("review.transcript") if callable(key_of) else "t"
        self.query_one("#review-pack", TextView).show(
            pack_render.pack_text(pack, transcript_key=key, shown_floor=shown_floor)
            if pack is not None
            else Text("")
        )
        pairs = pack.changed if pack is not None else []
        table = self.query_one("#review-pairs", DataTable)
        table.display = bool(pairs)
        signature = (pack.candidate_id if pack else "", tuple(pairs))
        if signature == self._pairs_key:
            return
        self._pairs_key, self._pairs = signature, list(pairs)
        table.clear()
        for p in pairs:
            table.add_row(*pack_render.pair_cells(p))


CONTROL_BUTTONS = (
    ("pause", "Pause", "control.pause"),
    ("resume", "Resume", "control.resume"),
    ("switch", "Switch phase", "control.switch"),
    ("probe", "Probe", "control.probe"),
    ("stop", "Stop", "control.stop"),
)


class ControlPanel(Vertical):
    """Buttons for the phase-control actions (enabled exactly when the action applies)."""

    def compose(self) -> ComposeResult:
        yield TextView(id="control-state")
        with Horizontal(id="control-buttons"):
            for action, label, _ in CONTROL_BUTTONS:
                yield Button(Text(label), id=f"btn-{action}", compact=True)
        yield TextView(id="control-probe")

    def update_view(
        self, view: RunView, *, state_text: Text, enabled: dict[str, bool], keys: dict[str, str]
    ) -> None:
        self.query_one("#control-state", TextView).show(state_text)
        for action, label, binding_id in CONTROL_BUTTONS:
            btn = self.query_one(f"#btn-{action}", Button)
            key = keys.get(binding_id, "")
            text = f"{label} ({key})" if key else label
            if btn.label.plain != text:
                btn.label = Text(text)
            disabled = not enabled.get(action, False)
            if btn.disabled != disabled:
                btn.disabled = disabled
        self.query_one("#control-probe", TextView).show(
            render.probe_text(view.probes, view.probe_running)
        )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id and event.button.id.startswith("btn-"):
            event.stop()
            self.app.call_later(self.app.run_action, event.button.id[4:])


class LogPanel(Vertical):
    """Engine log lines and TUI notices; capped, never markup."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._written = 0

    def compose(self) -> ComposeResult:
        yield RichLog(id="log", max_lines=2_000, markup=False, highlight=False, wrap=True)

    def update_view(self, view: RunView) -> None:
        log = self.query_one("#log", RichLog)
        new = view.log_count - self._written
        if new <= 0:
            return
        lines = list(view.logs)[-min(new, len(view.logs)) :]
        for line in lines:
            log.write(render.log_line(line.ts, line.level, line.message, view.first_ts))
        self._written = view.log_count

    def notice(self, level: str, message: str) -> None:
        """A line from the TUI itself (engine errors, library warnings), not from the run."""
        t = Text()
        t.append("tui   ", style="dim")
        t.append(message, style={"warning": "yellow", "error": "bold red"}.get(level, ""))
        self.query_one("#log", RichLog).write(t)
