"""The harness host: defaults, rendering, kwargs filtering, and every way harness code misbehaves.

A bad harness must cost only its own calls: each misbehaving call gets its CallResult kind, the other
calls of the batch still succeed, and the host keeps working (restarting itself when it must).
"""

from __future__ import annotations

import hashlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from whale_lab.config import SandboxConfig
from whale_lab.harness import HarnessHost, HarnessLoadError, RenderRequest, check_source
from whale_lab.harness.runtime import HarnessRuntime, LoadFailure
from whale_lab.harness.surfaces import fill_template

FIXTURES = Path(__file__).parent / "fixtures" / "harnesses"
FAST = SandboxConfig(call_timeout_s=0.5, memory_mb=512, max_output_chars=100)


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.py"


def line_of(path: Path, text: str) -> int:
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if text in line:
            return n
    raise AssertionError(f"{text!r} not in {path}")


@pytest.fixture(scope="module")
def chaos() -> Iterator[HarnessHost]:
    host = HarnessHost(fixture("misbehaving"), "math", FAST)
    yield host
    host.close()


# ------------------------------------------------------------------ contract and rendering


def test_prompt_only_harness_runs_with_all_defaults() -> None:
    path = fixture("prompt_only")
    with HarnessHost(path, "math") as host:
        info = host.info
        assert info.name == "prompt_only"
        assert info.sha == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (info.max_turns, info.format_retry_budget, info.illegal_move_retry_budget) == (
            4,
            1,
            1,
        )
        assert info.stop_sequences == ()
        assert set(info.constants) == {"SYSTEM_PROMPT", "USER_PROMPT"}
        assert info.surfaces == ("SYSTEM_PROMPT", "USER_PROMPT")

        no_obs, with_obs = host.render(
            [
                {
                    "fields": {"question": "2+2?"},
                    "history": [{"type": "observation", "observation": None}],
                },
                RenderRequest(
                    {"question": "3+3?"},
                    [{"type": "observation", "observation": {"hint": "add", "n": [1, 2]}}],
                ),
            ]
        )
        assert no_obs.ok and with_obs.ok
        assert no_obs.value == [
            {"role": "system", "content": info.system_prompt},
            {"role": "user", "content": "Problem: 2+2?\n"},
        ]
        assert with_obs.value[1]["content"] == "Problem: 3+3?\nhint: add\nn:\n  - 1\n  - 2"
        parsed = host.parse(["  \\boxed{4}\n", {"response": "x", "context": {"turn_count": 1}}])
        assert [r.value for r in parsed] == ["\\boxed{4}", "x"]


def test_render_builds_messages_in_history_order() -> None:
    history = [
        {"type": "observation", "observation": None},
        {"type": "response", "text": "first try"},
        {"type": "feedback", "kind": "format", "detail": "Use \\boxed{}."},
        {"type": "response", "text": "<python>print(1)</python>"},
        {"type": "observation", "observation": "1"},
        {"type": "response", "text": "\\boxed{1}"},
        {"type": "feedback", "kind": "illegal", "detail": "not allowed"},
    ]
    with HarnessHost(fixture("prompt_only"), "math") as host:
        (res,) = host.render([{"fields": {"question": "q"}, "history": history, "context": {}}])
    assert [(m["role"], m["content"]) for m in res.value] == [
        ("system", "You are a careful solver. Put the final answer in \\boxed{}."),
        ("user", "Problem: q\n"),
        ("assistant", "first try"),
        ("user", "Use \\boxed{}."),
        ("assistant", "<python>print(1)</python>"),
        ("user", "1"),
        ("assistant", "\\boxed{1}"),
        ("user", "not allowed"),
    ]


def test_every_surface_is_used_and_called_with_the_kwargs_it_accepts() -> None:
    history = [
        {"type": "observation", "observation": {"b": 2, "a": 1}},
        {"type": "response", "text": "<search>x</search>"},
        {"type": "observation", "observation": "doc 1"},
        {"type": "response", "text": "hmm"},
        {"type": "feedback", "kind": "format", "detail": "Use tags."},
    ]
    # parse_action(response) has no **kw, format_observation only named keyword-only arguments:
    # the extra context keys must simply not be passed to them.
    context = {"turn_count": 3, "max_turns": 3, "side_to_move": "white", "extra": [1]}
    with HarnessHost(fixture("full_surfaces"), "search") as host:
        info = host.info
        assert (info.max_turns, info.format_retry_budget, info.illegal_move_retry_budget) == (
            3,
            2,
            0,
        )
        assert info.stop_sequences == ("</answer>",)
        assert info.constants["TAGS"] == ("answer", "search")
        assert "dataclass" not in info.functions and "select_context" in info.functions
        (res,) = host.render(
            [{"fields": {"question": "Who?"}, "history": history, "context": context}]
        )
        assert res.ok, res.error
        assert res.value == [
            {"role": "system", "content": "Answer with <answer>...</answer>."},
            {
                "role": "user",
                "content": "Question: Who?\nTool says: [turn 3/3] a=1, b=2\n"
                "Literal braces stay: {ok} {unknown}",
            },
            {"role": "assistant", "content": "hmm"},
            {"role": "user", "content": "(format) Use tags. Turns left: 0."},
        ]
        assert res.output == "kept 4 of 6\n"
        answer, tool, nothing = host.parse(
            [{"response": "<answer>Paris", "context": context}, "<search>eiffel</search>", "no"]
        )
    assert answer.value == {"type": "answer", "content": "Paris"}
    assert tool.value == {"type": "tool", "name": "search", "arguments": {"query": "eiffel"}}
    assert nothing.ok and nothing.value is None


def test_a_batch_is_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    with HarnessHost(fixture("prompt_only"), "math") as host:
        sends: list[int] = []
        real_send = host._send
        monkeypatch.setattr(
            host,
            "_send",
            lambda data, deadline: (sends.append(len(data)), real_send(data, deadline)),
        )
        requests = [
            {
                "fields": {"question": f"q{i}"},
                "history": [{"type": "observation", "observation": None}],
                "context": {"turn_count": 1},
            }
            for i in range(256)
        ]
        results = host.render(requests)
    assert len(sends) == 1
    assert [r.value[1]["content"] for r in results] == [f"Problem: q{i}\n" for i in range(256)]


def test_requests_must_be_plain_data() -> None:
    with HarnessHost(fixture("prompt_only"), "math") as host:
        with pytest.raises(TypeError, match="plain JSON"):
            host.render([{"fields": {"question": object()}, "history": [], "context": {}}])
        with pytest.raises(TypeError, match="response must be str"):
            host.parse([{"response": 3, "context": {}}])
        assert host.parse(["still fine"])[0].value == "still fine"
        # text that is not valid Unicode (a lone surrogate) still crosses both ways intact
        assert host.parse(["a\udc80 \\ b"])[0].value == "a\udc80 \\ b"


# ------------------------------------------------------------------ misbehaving calls


def test_raise_wrong_type_and_python_hangs_cost_only_their_own_calls(chaos: HarnessHost) -> None:
    restarts = chaos.restarts
    results = chaos.parse(["raise", "ok 1", "type", "nonjson", "hang", "ok 2", "regex", "ok 3"])
    kinds = [r.kind for r in results]
    assert kinds == ["exception", "ok", "bad_type", "bad_type", "timeout", "ok", "timeout", "ok"]
    assert [results[i].value for i in (1, 5, 7)] == ["ok 1", "ok 2", "ok 3"]
    raised = results[0]
    assert raised.error.startswith("KeyError: 'raise'")
    assert raised.line == line_of(fixture("misbehaving"), "return value[text]")
    assert f"misbehaving.py:{raised.line} in helper_that_fails" in raised.error
    assert "str, dict or None, got int" in results[2].error
    assert "not plain JSON" in results[3].error
    assert "0.5s" in results[4].error
    # Python-level loops and the catastrophic regex are stopped inside the host: no restart.
    assert chaos.restarts == restarts


def test_render_failures_are_per_call(chaos: HarnessHost) -> None:
    def req(obs: str) -> dict:
        return {
            "fields": {"question": "Q:"},
            "history": [{"type": "observation", "observation": obs}],
            "context": {},
        }

    raised, wrong, fine = chaos.render([req("raise"), req("wrong"), req("board")])
    assert raised.kind == "exception" and "KeyError: 'no such board'" in raised.error
    assert wrong.kind == "bad_type" and "format_observation must return str, got int" in wrong.error
    assert fine.ok and fine.value == [{"role": "user", "content": "Q:board"}]


def test_hangs_the_host_cannot_interrupt_are_killed_by_the_client(chaos: HarnessHost) -> None:
    restarts = chaos.restarts
    # c_hang never returns to the interpreter; swallow catches the alarm and keeps looping.
    results = chaos.parse(["c_hang", "between", "swallow", "after"])
    assert [r.kind for r in results] == ["timeout", "ok", "timeout", "ok"]
    assert "restarted" in results[0].error and "restarted" in results[2].error
    assert [results[1].value, results[3].value] == ["between", "after"]
    assert chaos.restarts == restarts + 2
    assert chaos.parse(["later"])[0].value == "later"


def test_memory_exhaustion_is_reported_and_the_host_survives() -> None:
    # A generous time limit: filling memory page by page is slow on a busy machine.
    sandbox = SandboxConfig(call_timeout_s=20.0, memory_mb=300)
    with HarnessHost(fixture("misbehaving"), "math", sandbox) as host:
        results = host.parse(["memory", "after", "memory_loop", "after again"])
        assert [r.kind for r in results] == ["memory", "ok", "memory", "ok"]
        assert "300 MB" in results[0].error
        assert host.parse(["deque"])[0].value == "3"
        assert host.restarts == 0


def test_output_is_capped_and_a_flood_stops_the_call(chaos: HarnessHost) -> None:
    flood, chatty, after = chaos.parse(["flood", "chatty", "after"])
    assert flood.kind == "output_flood" and "characters of output" in flood.error
    assert chatty.ok and chatty.value == "chatty"
    assert chatty.output.startswith("y" * 100 + "\n... [")
    assert "more chars truncated" in chatty.output
    assert after.ok and after.output == ""


def test_a_host_that_dies_mid_call_marks_it_crashed_and_restarts(chaos: HarnessHost) -> None:
    assert chaos.parse(["warm up"])[0].ok  # a running host, whatever ran before
    restarts = chaos.restarts
    pid = chaos.pid
    assert pid is not None
    timer = threading.Timer(0.3, os.kill, (pid, signal.SIGSEGV))
    timer.start()
    try:
        died, after = chaos.parse(["swallow", "after"])
    finally:
        timer.cancel()
    assert died.kind == "crashed" and "SIGSEGV" in died.error
    assert after.ok and after.value == "after"
    assert chaos.restarts == restarts + 1 and chaos.pid != pid


def test_a_batch_that_keeps_timing_out_stops_running_calls() -> None:
    with HarnessHost(fixture("misbehaving"), "math", FAST, timeout_budget_s=0.8) as host:
        results = host.parse(["hang", "hang", "hang", "ok"])
        assert [r.kind for r in results] == ["timeout"] * 4
        assert "not run" in results[2].error and "not run" in results[3].error
        assert host.failures["timeout"] == 4
        assert host.parse(["ok"])[0].value == "ok"  # the next batch starts with a fresh budget


def test_call_runs_named_functions_with_kwargs_or_positional_args() -> None:
    with HarnessHost(fixture("chess_good"), "chess") as host:
        board = "Legal moves:\n- [e2e4] SAN=e4\n- [g1f3] SAN=Nf3"
        results = host.call(
            "is_legal_action", [[board, "e2e4"], {"board": board, "action": "a1a1"}]
        )
        assert [r.value for r in results] == [True, False]
        assert host.call("propose_action", [[board]])[0].value == ""
        (missing,) = host.call("solve_it", [[board]])
        assert missing.kind == "missing" and "solve_it" in missing.error
        # function surfaces fall back to their defaults
        assert host.call("format_feedback", [["format", "say more"]])[0].value == "say more"


def test_close_stops_the_process_and_is_idempotent() -> None:
    host = HarnessHost(fixture("prompt_only"), "math")
    pid = host.pid
    assert pid is not None and host.alive
    host.close()
    host.close()
    assert not host.alive and host.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(RuntimeError, match="closed"):
        host.parse(["x"])


# ------------------------------------------------------------------ load errors


@pytest.mark.parametrize(
    ("name", "line", "needle"),
    [
        ("bad_import_os", 3, "forbidden import 'os'"),
        ("bad_open", 5, "forbidden name 'open'"),
        ("bad_eval", 2, "forbidden name 'eval'"),
        ("bad_subclasses", 2, "forbidden dunder attribute '__subclasses__'"),
        ("bad_getattr_dunder", 2, "'__globals__' via getattr()"),
        ("bad_module_raises", 4, "module raised ValueError: invalid literal for int()"),
        ("bad_max_turns", 2, "MAX_TURNS must be an int in 1..100, got 0"),
    ],
)
def test_load_errors_name_file_line_and_reason(name: str, line: int, needle: str) -> None:
    path = fixture(name)
    with pytest.raises(HarnessLoadError) as err:
        HarnessHost(path, "math", FAST)
    assert err.value.line == line
    assert str(err.value).startswith(f"{path}:{line}: ")
    assert needle in err.value.reason


def test_syntax_errors_hangs_bad_types_and_missing_files_are_load_errors(tmp_path: Path) -> None:
    with pytest.raises(HarnessLoadError, match="did not finish within 1s"):
        HarnessHost(fixture("bad_module_hangs"), "math", FAST, load_timeout_s=1.0)
    with pytest.raises(HarnessLoadError, match="harness file not found"):
        HarnessHost(tmp_path / "nope.py", "math")
    bad = tmp_path / "types.py"
    # (syntax errors live here, not in a fixture file, so that linting the repository stays clean)
    bad.write_text(
        'USER_PROMPT = "{question}"\n\ndef parse_action(response)\n    return response\n'
    )
    with pytest.raises(HarnessLoadError, match=r"types.py:3: syntax error: expected ':'"):
        HarnessHost(bad, "math")
    bad.write_text("STOP_SEQUENCES = ['ok', 3]\n")
    with pytest.raises(HarnessLoadError, match="STOP_SEQUENCES must be a tuple of non-empty str"):
        HarnessHost(bad, "math")
    bad.write_text("def parse_action():\n    return 'x'\n")
    with pytest.raises(HarnessLoadError, match=r"parse_action must accept 1 positional"):
        HarnessHost(bad, "math")


# ------------------------------------------------------------------ the layers under the host


def test_static_check_rules() -> None:
    def problems(src: str) -> list[str]:
        return [p.message for p in check_source(src)]

    assert problems("import json\nfrom collections import Counter\nx = json.dumps([1])") == []
    assert problems("class A:\n    def f(self):\n        return self._cache") == []
    assert problems("import re\nre._compiler") == [
        "private attribute '_compiler' (allowed only on self or cls)"
    ]
    assert problems("from typing import get_type_hints") == [
        "forbidden attribute 'get_type_hints' imported from 'typing'"
    ]
    assert problems("from . import x") == ["relative imports are not allowed in harness code"]
    assert problems("def f(g):\n    return g.gi_frame") == ["forbidden attribute 'gi_frame'"]
    assert problems("match x:\n    case object(__class__=c):\n        pass") == [
        "forbidden dunder attribute '__class__' in a match pattern"
    ]
    assert problems("x = __builtins__") == ["forbidden name '__builtins__'"]


def test_runtime_refuses_escapes_even_without_the_static_check() -> None:
    def load_error(src: str) -> str:
        with pytest.raises(LoadFailure) as err:
            HarnessRuntime(src, "/virtual/h.py", static_check=False)
        return err.value.reason

    assert "import of 'os' is not allowed" in load_error("import os")
    assert "name 'open' is not defined" in load_error("open('/etc/passwd')")
    assert "name 'eval' is not defined" in load_error("eval('1')")
    assert "no attribute '_os'" in load_error("import random\nrandom._os")
    assert "no attribute 'sys'" in load_error("import dataclasses\ndataclasses.sys")
    assert "'__globals__' is not available" in load_error(
        "def f():\n    pass\ngetattr(f, '__globals__')"
    )
    ok = HarnessRuntime(
        "from __future__ import annotations\nimport collections.abc\nfrom dataclasses import "
        "dataclass\n\n@dataclass\nclass A:\n    x: int = 1\n\nN = A().x + len(collections.abc."
        "__name__)\n",
        "/virtual/ok.py",
        static_check=False,
    )
    assert ok.ns["N"] == 1 + len("collections.abc")


def test_fill_template_leaves_unknown_and_complex_placeholders() -> None:
    values = {"question": "Q", "n": 7, "observation": "O"}
    assert fill_template("{question} {observation}", values) == "Q O"
    assert fill_template("{{lit}} {missing} {n:>3} {n!r}", values) == "{lit} {missing}   7 7"
    assert fill_template("{question.__class__} {question[0]}", values) == (
        "{question.__class__} {question[0]}"
    )
    assert fill_template('json: {"a": 1} and {question}', values) == 'json: {"a": 1} and Q'
