"""The hostile corpus: harness files and tool snippets that attack the sandbox, one attack each.

Each file under tests/hostile/ says in its docstring what it attempts, `Expect: <outcome> [text]`
(how the attempt must end) and, for attacks that get past every Python-level check and that only
the operating system stops, `Needs: os-confinement`; those are skipped where bwrap cannot confine
(running them unconfined would let them kill the test run or leave processes behind).

Every case also asserts that nothing leaked: a canary planted in a run folder's answers file and in
the engine's environment never appears in anything the engine gets back (values, errors, output,
load errors, the host's stderr), a watched folder stays empty, no connection reaches a listening
local port, the engine keeps running, and, when confined, no process of the sandbox outlives it.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import secrets
import select
import socket
import sysconfig
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from whale_lab import confine
from whale_lab.config import SandboxConfig
from whale_lab.domains.interpreter import InterpreterLimits, PythonResult, run_python
from whale_lab.domains.tool_worker import ToolWorkers
from whale_lab.harness.host import HarnessHost, HarnessLoadError

CORPUS = Path(__file__).parent / "hostile"
HARNESSES = sorted((CORPUS / "harnesses").glob("*.py"))
TOOLS = sorted((CORPUS / "tools").glob("*.py"))
REPO = Path(__file__).resolve().parents[1]
DATA_FILE = REPO / "whale_lab" / "data" / "chess_puzzles.jsonl"

CONF = confine.detect()
NOT_CONFINED = f"needs OS confinement; this machine has none: {CONF.reason}"
CANARY = "whale-secret-" + secrets.token_hex(12)
CANARY_ENV = "WHALE_LAB_TEST_SECRET_TOKEN"

FAST = SandboxConfig(call_timeout_s=0.5, memory_mb=300, max_output_chars=400)
TOOL_LIMITS = InterpreterLimits(timeout_s=1.0, memory_mb=256, max_output_chars=400)
# The warm path's limits: more wall time, since fill_tmp's 16000 files take 0.4 s on a quiet
# machine and a loaded one can double that (the cold test above keeps its 1 s).
WARM_TOOL_LIMITS = dataclasses.replace(TOOL_LIMITS, timeout_s=2.0)
# A harness expected to run out of memory gets more wall time: filling 300 MB page by page took
# over 0.5 s once in a full suite on a loaded 2-core machine, and the outcome under test is the
# memory limit, not the clock.
MEMORY_CASE = dataclasses.replace(FAST, call_timeout_s=5.0)
OUTCOMES = {
    "load_error",
    "ok",
    "blocked",
    "sequence",
    "timeout",
    "memory",
    "output_flood",
    "exception",
    "bad_type",
    "crashed",
    "error",
    "stdout",
    "truncated",
}


@dataclass(frozen=True)
class Expect:
    outcome: str
    text: str
    needs_os: bool


def expectation(path: Path) -> Expect:
    """The `Expect:` and `Needs:` lines of a corpus file's docstring."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    lines = {k.strip(): v.strip() for k, _, v in (ln.partition(":") for ln in doc.splitlines())}
    if "Expect" not in lines:
        raise AssertionError(f"{path.name}: no 'Expect:' line in the docstring")
    outcome, _, text = lines["Expect"].partition(" ")
    if outcome not in OUTCOMES:
        raise AssertionError(f"{path.name}: unknown outcome {outcome!r}")
    return Expect(outcome, text, lines.get("Needs") == "os-confinement")


# ------------------------------------------------------------------ the secrets and the watchers


@dataclass
class Targets:
    canary_file: Path
    watched: Path
    listener: socket.socket
    data_sample: str

    @property
    def request(self) -> str:
        """What an attacking harness is told: where the secrets are (an attacker could guess)."""
        return json.dumps(
            {
                "canary": str(self.canary_file),
                "data": str(DATA_FILE),
                "repo": str(REPO),
                "watched": str(self.watched),
                "port": self.listener.getsockname()[1],
                "engine_pid": os.getpid(),
                "home_files": _home_files(),
                "stdlib": sysconfig.get_paths()["stdlib"],
            }
        )

    def substitute(self, code: str) -> str:
        t = json.loads(self.request)
        for key, value in {
            "__CANARY__": t["canary"],
            "__ENGINE_PID__": str(t["engine_pid"]),
            "__PORT__": str(t["port"]),
            "__WATCHED__": t["watched"],
            "__STDLIB__": t["stdlib"],
        }.items():
            code = code.replace(key, value)
        return code


def _home_files() -> list[str]:
    """A few files of the engine user's home folder, for an attacker to try."""
    home = Path(os.path.expanduser("~"))
    try:
        files = [str(p) for p in sorted(home.iterdir()) if p.is_file()]
    except OSError:
        files = []
    return files[:5]


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Targets]:
    root = tmp_path_factory.mktemp("engine")
    run = root / "runs" / "r1" / "splits"
    run.mkdir(parents=True)
    canary_file = run / "val_answers.jsonl"
    canary_file.write_text(json.dumps({"id": 1, "answer": CANARY}) + "\n")
    watched = root / "watched"
    watched.mkdir()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.setblocking(False)
    sample = DATA_FILE.read_text(encoding="utf-8").splitlines()[0][:60]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(CANARY_ENV, CANARY)
        yield Targets(canary_file, watched, listener, sample)
    listener.close()


def assert_nothing_leaked(targets: Targets, texts: list[str]) -> None:
    blob = "\n".join(texts)
    assert CANARY not in blob, "the canary leaked"
    assert targets.data_sample not in blob, "the data file leaked"
    assert list(targets.watched.iterdir()) == [], "a file was written outside the scratch folder"
    readable, _, _ = select.select([targets.listener], [], [], 0)
    assert not readable, "a connection reached the engine's local port"
    assert targets.canary_file.read_text().count(CANARY) == 1


# ------------------------------------------------------------------ process accounting


def _namespace_of_children(pid: int) -> list[str]:
    """The PID namespaces of `pid`'s children (bwrap's child is the sandbox's init)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out.append(os.readlink(f"/proc/{entry}/ns/pid"))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _processes_in(namespaces: set[str]) -> list[int]:
    """Live processes in these PID namespaces (a zombie awaiting its reaper has ended)."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") not in namespaces:
                    continue
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                alive.append(int(entry))
    return alive


class WatchedHost(HarnessHost):
    """A host that records the PID namespace of every sandbox it starts."""

    seen: set[str] = set()

    def _start(self) -> dict[str, Any]:
        try:
            return super()._start()
        finally:
            if self._proc is not None and self.confinement.confined:
                WatchedHost.seen.update(_namespace_of_children(self._proc.pid))


def assert_no_process_left() -> None:
    if not CONF.confined or not WatchedHost.seen:
        return
    deadline = time.monotonic() + 5.0
    while _processes_in(WatchedHost.seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_in(WatchedHost.seen) == [], "a sandbox process outlived its host"


# ------------------------------------------------------------------ the corpus


def test_the_corpus_is_big_enough_and_every_file_says_what_it_expects() -> None:
    assert len(HARNESSES) >= 30 and len(TOOLS) >= 8
    for path in HARNESSES + TOOLS:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        assert doc and len(doc.splitlines()[0]) > 10, f"{path.name}: say what it attempts"
        expectation(path)


RENDER = {"fields": {"question": "What is 2 + 2?"}, "history": [], "context": {}}
ESCAPE_MARKER = "# hostile: escape"
ESCAPE_PRELUDE = CORPUS / "escape_prelude.py.txt"


def materialise(path: Path, folder: Path) -> Path:
    """The harness file as the host will load it: the shared escape pasted in at its marker (each
    esc_*.py holds only its own attack; the harness host sees one self-contained file)."""
    text = path.read_text(encoding="utf-8")
    if ESCAPE_MARKER not in text:
        return path
    lines = [
        ESCAPE_PRELUDE.read_text(encoding="utf-8") if ln.startswith(ESCAPE_MARKER) else ln
        for ln in text.splitlines(keepends=True)
    ]
    out = folder / path.name
    out.write_text("".join(lines), encoding="utf-8")
    return out


def test_the_escape_prelude_is_pasted_into_a_self_contained_file(tmp_path: Path) -> None:
    escapes = [p for p in HARNESSES if ESCAPE_MARKER in p.read_text(encoding="utf-8")]
    assert len(escapes) >= 20
    text = materialise(escapes[0], tmp_path).read_text(encoding="utf-8")
    assert ESCAPE_MARKER not in text and "class _Grab(string.Formatter)" in text
    ast.parse(text)


@pytest.mark.parametrize("path", HARNESSES, ids=[p.stem for p in HARNESSES])
def test_hostile_harness(path: Path, targets: Targets, tmp_path: Path) -> None:
    exp = expectation(path)
    if exp.needs_os and not CONF.confined:
        pytest.skip(NOT_CONFINED)
    path = materialise(path, tmp_path)
    WatchedHost.seen = set()
    texts: list[str] = []
    if exp.outcome == "load_error":
        with pytest.raises(HarnessLoadError) as info:
            WatchedHost(path, "math", FAST, load_timeout_s=1.0)
        message = str(info.value)
        texts.append(message)
        assert exp.text in message and "\n" not in message
    else:
        limits = MEMORY_CASE if exp.outcome == "memory" else FAST
        host = WatchedHost(path, "math", limits, load_timeout_s=2.0)
        try:
            calls = 3 if exp.outcome == "sequence" else 1
            results = host.parse([targets.request] * calls)
            after = host.render([RENDER])[0]  # the host (or its replacement) still works
            texts += [host.load_output, host._stderr_tail(1 << 20)]
            for r in [*results, after]:
                texts += [json.dumps(r.value), r.error, r.output]
        finally:
            host.close()
        first = results[0]
        assert after.ok, f"the host did not recover: {after.error}"
        if exp.outcome == "sequence":
            assert [r.kind for r in results] == exp.text.split(",")
        elif exp.outcome in ("ok", "blocked"):
            assert first.ok, f"{first.kind}: {first.error}"
            assert isinstance(first.value, str) and "LEAK" not in first.value, first.value
            if exp.outcome == "blocked":
                assert first.value.startswith("blocked:"), first.value
            assert exp.text in first.value, first.value
        else:
            assert first.kind == exp.outcome, f"{first.kind}: {first.error}"
            assert exp.text in first.error and "\n" not in first.error, first.error
    assert_nothing_leaked(targets, texts)
    assert_no_process_left()


@pytest.mark.parametrize("path", TOOLS, ids=[p.stem for p in TOOLS])
def test_hostile_tool_code(path: Path, targets: Targets) -> None:
    exp = expectation(path)
    if exp.needs_os and not CONF.confined:
        pytest.skip(NOT_CONFINED)
    result = run_python(targets.substitute(path.read_text(encoding="utf-8")), TOOL_LIMITS)
    check_tool_result(exp, result)
    assert_nothing_leaked(targets, [result.stdout, result.error])


@pytest.mark.parametrize("path", TOOLS, ids=[p.stem for p in TOOLS])
def test_hostile_tool_code_on_a_warm_worker(path: Path, targets: Targets) -> None:
    """The same attacks through the warm path: the worker that ran one must not carry it into
    the episode's next call or into another episode, and no process outlives the pool."""
    exp = expectation(path)
    if exp.needs_os and not CONF.confined:
        pytest.skip(NOT_CONFINED)
    pool = ToolWorkers(WARM_TOOL_LIMITS, spares=0)
    seen: set[str] = set()
    try:
        session = pool.session()
        assert session.run("print('warm')").stdout == "warm\n"
        for pid in pool.pids():
            seen.update(_namespace_of_children(pid) if CONF.confined else [])
        result = session.run(targets.substitute(path.read_text(encoding="utf-8")))
        check_tool_result(exp, result)
        after = session.run("print('after')")  # the episode's next call (a fresh worker if need be)
        assert after.ok and after.stdout == "after\n", after
        for pid in pool.pids():
            seen.update(_namespace_of_children(pid) if CONF.confined else [])
        session.end()
        other = pool.session().run("import os\nprint(sorted(os.listdir('.'))[:3])")
        assert other.ok and not other.stdout.startswith("['f0'"), other  # nothing left in /tmp
        texts = [result.stdout, result.error, after.stdout, after.error, other.stdout, other.error]
    finally:
        pool.close()
    assert_nothing_leaked(targets, texts)
    deadline = time.monotonic() + 5.0
    while seen and _processes_in(seen) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not seen or _processes_in(seen) == [], "a sandbox process outlived the worker pool"


def check_tool_result(exp: Expect, result: PythonResult) -> None:
    """The outcome a tool snippet's docstring expects."""
    if exp.outcome == "ok":
        assert result.ok, result.error
    elif exp.outcome == "error":
        assert not result.ok and exp.text in result.error, result.error
    elif exp.outcome == "truncated":
        assert result.truncated or "OutputLimit" in result.error, result
    else:  # stdout: every attempt the code made printed what stopped it
        assert result.ok, result.error
        lines = [ln for ln in result.stdout.splitlines() if ln.strip()]
        assert lines and all(ln.startswith(exp.text) for ln in lines), result.stdout
