"""The run directory is the single source of truth: atomic files and append-only JSONL logs."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_lab.events import Event, event_from_dict


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write via a temp file in the same folder and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return default


class JsonlWriter:
    """Append-only JSON lines; each record is one write + flush, so a crash tears at most one line."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._repair_torn_tail()
        self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._lines = sum(1 for _ in read_jsonl(self.path))

    def _repair_torn_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as fh:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                data = self.path.read_bytes()
                cut = data.rfind(b"\n") + 1
                fh.truncate(cut)

    def append(self, record: dict[str, Any]) -> int:
        """Append and return the 0-based line number of the record."""
        line = json.dumps(record, default=str, ensure_ascii=False)
        with self._lock:
            self._fh.write(line + "\n")
            self._fh.flush()
            n = self._lines
            self._lines += 1
        return n

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every complete, parseable line; a torn last line is skipped."""
    try:
        fh = open(path, encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            if not line.endswith("\n"):
                break
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def read_jsonl_line(path: str | Path, index: int) -> dict[str, Any] | None:
    for i, rec in enumerate(read_jsonl(path)):
        if i == index:
            return rec
    return None


def new_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in name) or "run"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"


class RunStore:
    """One run folder: `events.jsonl`, `config.json`, `state.json`, traces, checkpoints, archives."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._events = JsonlWriter(self.root / "events.jsonl")
        self._traces: dict[str, JsonlWriter] = {}
        self._listeners: list = []

    @classmethod
    def create(cls, directory: str | Path, name: str) -> RunStore:
        """A new run folder, claimed with an exclusive `mkdir`: two processes started in the same
        second (two `eval`s side by side) get `<id>` and `<id>-2`, never one shared folder."""
        base = Path(directory)
        base.mkdir(parents=True, exist_ok=True)
        run_id = new_run_id(name)
        root = base / run_id
        n = 1
        while True:
            try:
                root.mkdir()
                break
            except FileExistsError:
                n += 1
                root = base / f"{run_id}-{n}"
        return cls(root)

    @property
    def run_id(self) -> str:
        return self.root.name

    # events
    def subscribe(self, listener) -> None:
        self._listeners.append(listener)

    def emit(self, event: Event) -> None:
        self._events.append(event.to_dict())
        for listener in list(self._listeners):
            listener(event)

    def events(self) -> list[Event]:
        return self.read_events(self.root)

    @staticmethod
    def read_events(root: str | Path) -> list[Event]:
        """Replay a run folder's events without opening it for writing."""
        out = []
        for rec in read_jsonl(Path(root) / "events.jsonl"):
            ev = event_from_dict(rec)
            if ev is not None:
                out.append(ev)
        return out

    # traces
    def trace_writer(self, name: str) -> JsonlWriter:
        """`traces/<name>.jsonl`, shared across calls with the same name."""
        if name not in self._traces:
            self._traces[name] = JsonlWriter(self.root / "traces" / f"{name}.jsonl")
        return self._traces[name]

    # state
    def write_state(self, state: dict[str, Any]) -> None:
        atomic_write_json(self.root / "state.json", state)

    def read_state(self) -> dict[str, Any]:
        return read_json(self.root / "state.json", {}) or {}

    def close(self) -> None:
        self._events.close()
        for w in self._traces.values():
            w.close()
