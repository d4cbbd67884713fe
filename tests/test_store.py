"""The run folder: atomic files, append-only logs that survive a torn last line, event replay."""

from __future__ import annotations

import json
from pathlib import Path

from whale_lab import events as ev
from whale_lab.store import JsonlWriter, RunStore, atomic_write_json, read_json, read_jsonl


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    p = tmp_path / "a" / "state.json"
    atomic_write_json(p, {"step": 1})
    atomic_write_json(p, {"step": 2})
    assert read_json(p) == {"step": 2}
    assert [x.name for x in p.parent.iterdir()] == ["state.json"]


def test_torn_last_line_is_skipped_and_repaired(tmp_path: Path) -> None:
    p = tmp_path / "log.jsonl"
    p.write_text(json.dumps({"a": 1}) + "\n" + '{"a": 2, "b"')
    assert list(read_jsonl(p)) == [{"a": 1}]
    w = JsonlWriter(p)
    assert w.append({"a": 3}) == 1
    w.close()
    assert list(read_jsonl(p)) == [{"a": 1}, {"a": 3}]


def test_events_round_trip_through_the_store(tmp_path: Path) -> None:
    store = RunStore.create(tmp_path, "t")
    seen: list[ev.Event] = []
    store.subscribe(seen.append)
    store.emit(ev.RunStarted(run_id=store.run_id, domain="math", model="micro", schedule="whale",
                             harness="h0"))
    store.emit(ev.WeightStep(cycle=1, step=1, epoch=0.1, train_reward=0.25, accept_rate=0.25,
                             kept=4, loss=1.5, tokens=100, grad_norm=0.3, step_seconds=1.0,
                             rollouts=16))
    store.emit(ev.ReviewRequested(candidate_id="c1", diff="-a\n+b", hypothesis="h", surface="parser",
                                  cited_traces=("t1", "t2")))
    store.close()
    again = RunStore(store.root)
    replayed = again.events()
    assert replayed == seen
    assert isinstance(replayed[2], ev.ReviewRequested) and replayed[2].cited_traces == ("t1", "t2")


def test_unknown_event_types_are_ignored(tmp_path: Path) -> None:
    p = tmp_path / "events.jsonl"
    p.write_text(json.dumps({"type": "from_the_future", "x": 1}) + "\n"
                 + json.dumps({"type": "log", "level": "info", "message": "hi", "ts": 1.0}) + "\n")
    store = RunStore(tmp_path)
    assert store.events() == [ev.Log(level="info", message="hi", ts=1.0)]


def test_runs_created_in_the_same_second_get_their_own_folders(tmp_path: Path) -> None:
    """Two processes that start in the same second race between "does it exist" and "create it";
    the folder is claimed by an exclusive mkdir, so each gets its own (here the race is made
    certain by creating several stores under one fixed id from parallel threads)."""
    import threading
    from unittest import mock

    roots: list[Path] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def make() -> None:
        start.wait()
        store = RunStore.create(tmp_path, "eval")
        with lock:
            roots.append(store.root)
        store.close()

    with mock.patch("whale_lab.store.new_run_id", return_value="20261205-085502-eval"):
        threads = [threading.Thread(target=make) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    names = sorted(r.name for r in roots)
    assert len(set(names)) == 8
    assert names[0] == "20261205-085502-eval"
    assert set(names[1:]) == {f"20261205-085502-eval-{n}" for n in range(2, 9)}
    # a folder somebody else created first is never reused
    with mock.patch("whale_lab.store.new_run_id", return_value="20261205-085502-eval"):
        with mock.patch.object(Path, "exists", return_value=False):
            late = RunStore.create(tmp_path, "eval")
    assert late.root.name == "20261205-085502-eval-9"
    late.close()
