"""The review pack and steer notes in the app, over a recorded harness phase.

The recorded run (`fixtures/review_run`, written by `make_review_fixture.py`) holds a real LLM
proposer session's transcript beside candidate c001, whose smoke run fixes two tasks of the
incoming harness c000 and breaks one.
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Input

from whale_lab.config import Config
from whale_lab.engine.safepoints import SafePoints
from whale_lab.events import RunFinished, RunStarted
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore
from whale_lab.tui.app import WhaleLabApp
from whale_lab.tui.pack_render import pack_text, transcript_text
from whale_lab.tui.review_pack import build_pack, files_read, paired_traces
from whale_lab.tui.screens import PairedTraceScreen, SteerScreen, TranscriptScreen
from whale_lab.tui.state import load_run_events, replay
from whale_lab.tui.widgets import ReviewPanel

REVIEW_RUN = Path(__file__).resolve().parent / "fixtures" / "review_run"
SIZE = (120, 40)


@pytest.fixture
def review_run(tmp_path: Path) -> Path:
    dst = tmp_path / "review_run"
    shutil.copytree(REVIEW_RUN, dst)
    return dst


# ---------------------------------------------------------------------- the pack itself


def test_pack_pairs_the_smoke_run_with_the_incoming_harness(review_run: Path) -> None:
    pack = build_pack(review_run, "c001")
    assert pack.incoming_id == "c000" and pack.source == "smoke"
    assert [p.task_id for p in pack.fixes] == ["search-harness-00001", "search-harness-00004"]
    assert [p.task_id for p in pack.breaks] == ["search-harness-00003"]
    assert len(pack.pairs) == 6  # the smoke run's tasks; c000's other two are not paired
    assert pack.paired["n_tasks"] == 6
    assert pack.paired["diff"] == pytest.approx(1 / 6)
    assert "smallest difference" in pack.noise_floor["note"]
    assert pack.smoke["success_rate"] == 0.5
    text = pack_text(pack).plain
    assert "fixes 2" in text and "breaks 1" in text and "smoke run only" in text
    assert "candidates/c000/traces.jsonl" in text  # what the proposer read
    assert "press t" in text


def test_pack_prefers_scored_traces_once_the_candidate_is_scored(review_run: Path) -> None:
    folder = review_run / "harness_phases" / "cycle-01" / "candidates" / "c001"
    smoke = (folder / "smoke_traces.jsonl").read_text(encoding="utf-8")
    (folder / "traces.jsonl").write_text(smoke.replace('"reward": 1.0', '"reward": 0.0'))
    pack = build_pack(review_run, "c001")
    assert pack.source == "scored"
    assert not pack.fixes and len(pack.breaks) == 2  # c000 solved 00000 and 00003
    assert "scored on the harness split" in pack_text(pack).plain


def test_pack_says_why_it_is_empty(tmp_path: Path, review_run: Path) -> None:
    assert "no run folder" in build_pack(None, "c001").problem
    assert "no archive folder" in build_pack(tmp_path, "c001").problem
    incoming = build_pack(review_run, "c000")
    assert not incoming.pairs and incoming.transcript is None
    assert "not an LLM" in pack_text(incoming).plain


def test_files_read_counts_the_archive_tools(review_run: Path) -> None:
    pack = build_pack(review_run, "c001")
    tools = [(f.tool, f.target) for f in pack.files_read]
    assert tools == [
        ("list_files", "."),
        ("read_file", "summary.md"),
        ("grep", '"reward": 0.0 in candidates/c000'),
        ("read_file", "candidates/c000/traces.jsonl"),
    ]
    entries = [{"kind": "tool", "name": "read_file", "arguments": "not json"}] * 2
    assert [(f.target, f.times) for f in files_read({"entries": entries})] == [(".", 2)]


def test_transcript_text_shows_requests_replies_and_tool_results(review_run: Path) -> None:
    pack = build_pack(review_run, "c001")
    assert pack.transcript is not None
    text = transcript_text(pack.transcript).plain
    assert "session 5e55i0n0f1x7" in text and "4 requests · 5 tool calls" in text
    assert "── request 0" in text and "[system] You improve the harness" in text
    assert "→ write_candidate(" in text and "titles should help" in text
    assert "← read_file" in text and "# Candidates" in text  # a tool result, as recorded
    assert "more characters in the file" in text  # the system message is cut for the screen


def test_transcript_text_caps_entries() -> None:
    entries = [{"kind": "tool", "name": "grep", "result": "x" * 5000}] * 450
    text = transcript_text({"entries": entries, "entries_dropped": 3}).plain
    assert "[50 more entries in the file]" in text
    assert "3 entries were not recorded" in text
    assert len(text) < 450 * 1700


def test_paired_traces_are_the_same_task_under_both_harnesses(review_run: Path) -> None:
    pack = build_pack(review_run, "c001")
    left, right = paired_traces(pack, "search-harness-00001")
    assert left is not None and right is not None
    assert left.task_id == right.task_id == "search-harness-00001"
    assert (left.harness, left.reward, right.harness, right.reward) == ("c000", 0.0, "c001", 1.0)


# ---------------------------------------------------------------------- in the app


def replay_app(run: Path) -> WhaleLabApp:
    return WhaleLabApp(Config(), run_dir=str(run), replay_only=True, flush_interval=0.05)


async def test_review_tab_shows_the_pack_and_opens_transcript_and_pairs(review_run: Path) -> None:
    app = replay_app(review_run)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("3")
        await pilot.pause()
        panel = app.query_one(ReviewPanel)
        assert panel.pack is not None and panel.pack.candidate_id == "c001"
        pairs = app.query_one("#review-pairs", DataTable)
        assert pairs.row_count == 3 and pairs.display
        assert app.check_action("transcript", ()) is True
        assert app.check_action("approve", ()) is None  # no engine waits on it
        await pilot.press("t")
        assert isinstance(app.screen, TranscriptScreen)
        shown = str(app.screen.query_one("#transcript-text").render())
        assert "write_candidate" in shown
        await pilot.press("escape")
        assert not isinstance(app.screen, TranscriptScreen)
        pairs.focus()
        await pilot.press("down")  # the second changed task: search-harness-00004 (fixed)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, PairedTraceScreen)
        screen = app.screen
        assert screen.left is not None and screen.right is not None
        assert screen.left.task_id == screen.right.task_id == "search-harness-00004"
        assert "fixes it" in screen.titles[0]
        await pilot.press("tab")
        assert screen.query_one("#paired-right").has_focus
        await pilot.press("escape")
        assert not isinstance(app.screen, PairedTraceScreen)


async def test_steer_needs_a_running_engine(review_run: Path) -> None:
    app = replay_app(review_run)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.press("3")
        assert app.check_action("steer", ()) is None
        assert "resume the run first" in app._why_not("steer")
        await pilot.press("n")
        assert not isinstance(app.screen, SteerScreen)


class SteerableEngine:
    """The run's command handling as the engine has it (`SafePoints`), with no phases: it
    polls commands until stopped, so a steer note goes the engine's real way into events."""

    def __init__(self, store: RunStore, commands: CommandChannel) -> None:
        self.store = store
        self.points = SafePoints(
            commands, store.emit, validate_probe=lambda c: None, run_probe=lambda: None
        )
        self.polled = threading.Event()

    def run(self) -> None:
        self.points.set("running")
        self.store.emit(
            RunStarted(
                run_id="review-fixture",
                domain="search",
                model="micro",
                schedule="harness-only",
                harness="harnesses/search/h0.py",
                resumed=True,
            )
        )
        while not self.points.stop_requested():
            self.points.poll()
            self.polled.set()
            time.sleep(0.02)
        self.store.emit(RunFinished(status="stopped", message="stopped"))


async def test_steer_note_travels_as_a_command_into_the_event_log(
    review_run: Path, wait_for
) -> None:
    engines: list[SteerableEngine] = []

    def factory(cfg: Config, run_dir: Any, reviewer: Any, commands: CommandChannel) -> Any:
        store = RunStore(run_dir)
        engines.append(SteerableEngine(store, commands))
        return engines[-1], store

    app = WhaleLabApp(
        Config(), run_dir=str(review_run), engine_factory=factory, flush_interval=0.05
    )
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: bool(engines) and engines[0].polled.is_set())
        await pilot.press("3")
        await wait_for(pilot, lambda: app.check_action("steer", ()) is True)
        await pilot.press("n")
        assert isinstance(app.screen, SteerScreen)
        assert "rules" in str(app.screen.where)  # the default proposer cannot read notes
        await pilot.press("enter")  # an empty note is refused
        assert isinstance(app.screen, SteerScreen)
        app.screen.query_one("#steer-input", Input).value = "show  the passage titles "
        await pilot.press("enter")
        assert not isinstance(app.screen, SteerScreen)
        # "sent" until the engine's SteerNoted comes back (here at once: the engine only polls)
        await wait_for(pilot, lambda: bool(app.view.steer_notes))
        assert not app.steer_sent  # recorded by the engine now
        (note,) = app.view.steer_notes.values()
        assert (note.text, note.status, note.by) == ("show the passage titles", "noted", "tui")
        await pilot.press("n")
        assert "waits for the next proposer session" in str(
            app.screen.query_one("#steer-history-text").render()
        )
        await pilot.press("escape")
    recorded = [e for e in load_run_events(review_run) if e.type == "steer_noted"]
    assert [(e.note_id, e.text) for e in recorded] == [(note.note_id, "show the passage titles")]
    again = replay(load_run_events(review_run))  # and a reopened run shows the same note
    assert again.steer_notes[note.note_id].text == "show the passage titles"


def test_steer_history_shows_where_each_note_went_and_what_followed() -> None:
    from whale_lab.events import CandidateProposed, CandidateScored, SteerDelivered, SteerNoted
    from whale_lab.tui.pack_render import steer_history

    view = replay(
        [
            SteerNoted(note_id="s1", text="show the passage titles", by="tui"),
            SteerNoted(note_id="s2", text="stop after two failed searches", by="tui"),
            SteerDelivered(
                note_id="s1",
                cycle=1,
                iteration=2,
                proposer="llm",
                applied=True,
                detail="in the system message of its session",
            ),
            CandidateProposed(
                cycle=1,
                iteration=2,
                candidate_id="c001",
                parent_id="c000",
                hypothesis="titles",
                surface="tool_io",
                proposer="llm",
            ),
            CandidateScored(
                candidate_id="c001",
                success_rate=0.25,
                mean_turns=2.0,
                tokens=10,
                rollouts=4,
                status="evaluated",
            ),
        ]
    )
    assert view.steer_notes["s1"].status == "applied"
    text = steer_history(list(view.steer_notes.values()), {"s3": "keep it short"}, view.candidates)
    lines = text.plain.splitlines()
    assert lines[0].startswith("noted") and "waits for the next proposer session" in lines[0]
    assert "cycle 1 iteration 2 (llm)" in lines[1] and "wrote c001 25%" in lines[1]
    assert lines[2].startswith("sent") and "next safe point" in lines[2]
