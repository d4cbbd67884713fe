"""Math domain: generator, splits, python tool limits, verifier, actions, an episode, h0."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import re
from collections import Counter
from fractions import Fraction
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from whale_lab.config import config_from_dict
from whale_lab.domains import make_domain
from whale_lab.domains.base import SPLITS, Action
from whale_lab.domains.interpreter import InterpreterLimits, run_python
from whale_lab.domains.math import MathDomain, verify_math
from whale_lab.domains.math_problems import (
    MAX_DIFFICULTY,
    TEMPLATES,
    eval_exact,
    generate_problem,
    generate_problems,
)
from whale_lab.domains.text import extract_boxed, format_number, parse_number

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"weight": 60, "harness": 20, "val": 20, "test": 20}
HARNESS_IMPORTS = {
    "__future__",
    "collections",
    "dataclasses",
    "functools",
    "itertools",
    "json",
    "math",
    "random",
    "re",
    "statistics",
    "string",
    "textwrap",
    "typing",
}


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"h0_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            names.add((node.module or "").split(".")[0])
    return names


# ------------------------------------------------------------------ verifier and text helpers


@pytest.mark.parametrize(
    "pred",
    [
        "72",
        "$72",
        "72.",
        "72 dollars",
        "\\boxed{72}",
        "72.00",
        "The answer is 72.",
        "x = 72",
        "144/2",
        "\\frac{144}{2}",
    ],
)
def test_verify_right_answers(pred: str) -> None:
    assert verify_math(pred, 72)


@pytest.mark.parametrize("pred", ["71", "-72", "720", "7.2", "\\boxed{73}"])
def test_verify_wrong_answers(pred: str) -> None:
    assert not verify_math(pred, 72)


@pytest.mark.parametrize(
    "pred", [None, "", "   ", "seventy-two", "72 or 73", "\\boxed{}", "3^2", "1/0"]
)
def test_verify_malformed_answers_score_zero(pred: str | None) -> None:
    assert not verify_math(pred, 72)


def test_verify_exact_decimals_fractions_and_commas() -> None:
    assert verify_math("$1,234.50", 1234.5)
    assert verify_math("1234.5", "1234.50")
    assert verify_math("0.75", Fraction(3, 4))
    assert verify_math("\\dfrac{3}{4}", "3/4")
    assert not verify_math("0.33", "1/3")
    assert verify_math("12.5 km/h", 12.5)


def test_verify_non_numeric_gold_uses_latex_normalisation() -> None:
    assert verify_math("\\boxed{\\sqrt{2}}", "\\sqrt{2}")
    assert verify_math("$\\sqrt{2}$", "\\sqrt{2}")
    assert not verify_math("\\sqrt{3}", "\\sqrt{2}")


def test_extract_boxed_handles_nesting_and_takes_last() -> None:
    assert extract_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("no box") is None
    assert extract_boxed("\\boxed{unclosed") is None


def test_parse_and_format_numbers() -> None:
    assert parse_number("-2.5") == Fraction(-5, 2)
    assert parse_number("1 000") == 1000
    assert parse_number("5 or 6") is None
    assert format_number(Fraction(15, 4)) == "3.75"
    assert format_number(Fraction(7, 3)) == "7/3"
    assert format_number(Fraction(-1, 8)) == "-0.125"


# ------------------------------------------------------------------ generator


def run_solution(code: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(code, {})  # our own generated code, not model output
    return buf.getvalue()


def test_generator_is_deterministic_by_seed() -> None:
    a = generate_problems(3, 40)
    b = generate_problems(3, 40)
    c = generate_problems(4, 40)
    assert [p.question for p in a] == [p.question for p in b]
    assert [p.question for p in a] != [p.question for p in c]


def test_every_level_has_several_templates() -> None:
    for d in range(1, MAX_DIFFICULTY + 1):
        assert len(TEMPLATES[d]) >= 4


def test_problems_are_consistent_and_graded() -> None:
    problems = generate_problems(11, 400)
    numbers_in_question: dict[int, list[int]] = {d: [] for d in range(1, MAX_DIFFICULTY + 1)}
    for p in problems:
        meta = p.meta()
        assert meta["difficulty"] == len(meta["steps"]) == p.difficulty
        # each step's expression evaluates to its recorded result, the last one is the answer
        for step in meta["steps"]:
            assert set(step) == {"text", "var", "expr", "result"}
            assert step["text"] and step["var"].isidentifier()
            assert eval_exact(step["expr"]) == parse_number(step["result"])
        assert parse_number(meta["steps"][-1]["result"]) == p.value
        # the program prints the answer, and the worked solution ends in it
        assert parse_number(run_solution(meta["solution_code"])) == p.value
        assert verify_math(meta["solution_text"].splitlines()[-1], p.answer)
        assert p.value >= 0
        assert isinstance(p.answer, int) or Fraction(repr(p.answer)) == p.value
        numbers_in_question[p.difficulty].append(len(re.findall(r"\d+", p.question)))
    counts = Counter(p.difficulty for p in problems)
    assert set(counts) == set(range(1, MAX_DIFFICULTY + 1))
    assert max(counts.values()) - min(counts.values()) <= 1
    mean = {d: sum(v) / len(v) for d, v in numbers_in_question.items()}
    assert mean[1] < mean[3] < mean[5]


def test_generate_problem_rejects_bad_difficulty() -> None:
    import random

    with pytest.raises(ValueError):
        generate_problem(random.Random(0), MAX_DIFFICULTY + 1)


# ------------------------------------------------------------------ splits


def test_builtin_splits_disjoint_deterministic_and_mixed() -> None:
    d1 = MathDomain.builtin(5, SIZES)
    d2 = MathDomain.builtin(5, SIZES)
    d3 = MathDomain.builtin(6, SIZES)
    questions = {s: [t.fields["question"] for t in d1.tasks(s)] for s in SPLITS}
    for s in SPLITS:
        assert len(questions[s]) == SIZES[s] == len(set(questions[s]))
        assert questions[s] == [t.fields["question"] for t in d2.tasks(s)]
        mix = Counter(t.meta["difficulty"] for t in d1.tasks(s))
        assert set(mix) == set(range(1, MAX_DIFFICULTY + 1))
        assert max(mix.values()) - min(mix.values()) <= 1
    all_q = [q for s in SPLITS for q in questions[s]]
    assert len(all_q) == len(set(all_q))
    assert questions["test"] != [t.fields["question"] for t in d3.tasks("test")]
    # the test split depends only on the seed and its own size
    bigger = MathDomain.builtin(5, {**SIZES, "weight": 90})
    assert [t.fields["question"] for t in bigger.tasks("test")] == questions["test"]


def test_tasks_carry_fields_answer_and_meta() -> None:
    task = MathDomain.builtin(0, SIZES).tasks("val")[0]
    assert set(task.fields) == {"question"}
    assert task.domain == "math"
    assert {"difficulty", "steps", "solution_code"} <= set(task.meta)
    assert isinstance(task.answer, (int, float))


def test_from_config_through_registry() -> None:
    cfg = config_from_dict({"run": {"seed": 2}, "domain": {"name": "math", "splits": SIZES}})
    domain = make_domain(cfg)
    assert isinstance(domain, MathDomain)
    assert [len(domain.tasks(s)) for s in SPLITS] == [SIZES[s] for s in SPLITS]
    with pytest.raises(ValueError):
        domain.tasks("train")  # type: ignore[arg-type]


# ------------------------------------------------------------------ actions


def test_normalise_action_forms() -> None:
    dom = MathDomain.builtin(0, SIZES)
    assert dom.normalise_action("  42 ") == Action(kind="answer", value="42")
    assert dom.normalise_action({"type": "answer", "content": 42}).value == "42"
    tool = dom.normalise_action(
        {"type": "tool", "name": "python", "arguments": {"code": "print(1)"}}
    )
    assert (tool.kind, tool.tool, tool.args["code"]) == ("tool", "python", "print(1)")
    invalid = [
        None,
        "",
        {"type": "tool", "name": "search", "arguments": {"query": "x"}},
        {"type": "tool", "name": "python", "arguments": {}},
        {"type": "answer"},
        {"type": "move", "move": "e2e4"},
        {"type": "nonsense"},
        17,
        {"type": "invalid", "reason": "nope"},
    ]
    for raw in invalid:
        action = dom.normalise_action(raw)
        assert action.kind == "invalid" and action.reason, raw
    assert "search" in dom.normalise_action({"type": "tool", "name": "search"}).reason


# ------------------------------------------------------------------ interpreter

FAST = InterpreterLimits(timeout_s=1.0, memory_mb=256, max_output_chars=300)


def test_interpreter_runs_code() -> None:
    r = run_python("import fractions\nprint(fractions.Fraction(1, 3) + 1)", FAST)
    assert r.ok and r.stdout == "4/3\n"


def test_interpreter_reports_errors_with_traceback() -> None:
    r = run_python("x = 1\ny = x / 0\n", FAST)
    assert "ZeroDivisionError" in r.error and "line 2" in r.error
    assert "whale" not in r.error  # no frames of the wrapper
    r = run_python("def f(:\n  pass", FAST)
    assert "SyntaxError" in r.error


def test_interpreter_time_limit() -> None:
    r = run_python("while True:\n    pass\n", FAST)
    assert r.timed_out and "TimeoutError" in r.error


def test_interpreter_memory_limit() -> None:
    r = run_python("block = bytearray(2 * 1024 ** 3)\nprint(len(block))", FAST)
    assert "MemoryError" in r.error and r.stdout == ""


def test_interpreter_output_cap() -> None:
    r = run_python("print('x' * 5000)", FAST)
    assert r.truncated and r.stdout.startswith("x" * 300)
    assert len(r.stdout) < 400 and "truncated" in r.stdout
    flood = run_python("while True:\n    print('y' * 100)\n", FAST)
    assert flood.truncated and len(flood.stdout) < 400 and "OutputLimit" in flood.error


# ------------------------------------------------------------------ episodes


def test_episode_with_python_then_answer() -> None:
    dom = MathDomain.builtin(1, SIZES)
    task = dom.tasks("test")[0]
    env = dom.make_env(task)
    assert env.initial_observation() is None and env.context() == {}
    out = env.step(
        dom.normalise_action(
            {"type": "tool", "name": "python", "arguments": {"code": task.meta["solution_code"]}}
        )
    )
    assert not out.done and not out.tool_error
    assert out.observation["stdout"].strip() == format_number(Fraction(str(task.answer)))
    bad = env.step(
        dom.normalise_action(
            {"type": "tool", "name": "python", "arguments": {"code": "print(undefined_name)"}}
        )
    )
    assert not bad.done and bad.tool_error and "NameError" in bad.observation["error"]
    assert set(bad.observation) == {"code", "stdout", "error"}
    done = env.step(dom.normalise_action(f"\\boxed{{{task.answer}}}"))
    assert done.done and done.reward == 1.0 and done.stop_reason == "answered"
    info = env.final_info()
    assert info["python_calls"] == 2 and info["python_errors"] == 1 and info["correct"]


def test_episode_tool_limits_hold_on_its_warm_worker() -> None:
    dom = MathDomain.builtin(1, SIZES, FAST)
    try:
        env = dom.make_env(dom.tasks("test")[0])

        def call(code: str) -> Any:
            return env.step(
                dom.normalise_action({"type": "tool", "name": "python", "arguments": {"code": code}})
            )

        slow = call("import sys\nsys.whale_mark = 1\nwhile True:\n    pass\n")
        assert slow.tool_error and slow.info["timed_out"]
        assert "TimeoutError" in slow.observation["error"]
        flood = call("print('x' * 5000)")
        assert flood.info["truncated"] and "truncated" in flood.observation["stdout"]
        ok = call("import sys\nprint(6 * 7, hasattr(sys, 'whale_mark'))")
        assert not ok.tool_error and ok.observation["stdout"] == "42 False\n"
        assert env.final_info()["python_calls"] == 3
    finally:
        dom.close()
        dom.close()  # closing twice is harmless


def test_episode_python_state_stays_in_its_episode() -> None:
    dom = MathDomain.builtin(1, SIZES, FAST)
    try:
        task = dom.tasks("test")[0]

        def call(env: Any, code: str) -> str:
            action = {"type": "tool", "name": "python", "arguments": {"code": code}}
            return str(env.step(dom.normalise_action(action)).observation["stdout"])

        first = dom.make_env(task)
        assert call(first, "import math\nmath.tau = 1\nprint(math.tau)") == "1\n"
        assert call(first, "import math\nprint(math.tau)") == "1\n"  # the same interpreter
        first.final_info()
        second = dom.make_env(task)
        assert call(second, "import math\nprint(math.tau)") == "6.283185307179586\n"
    finally:
        dom.close()


def test_episode_wrong_and_malformed_answers() -> None:
    dom = MathDomain.builtin(1, SIZES)
    task = dom.tasks("test")[1]
    wrong = dom.make_env(task).step(Action(kind="answer", value=str(task.answer + 1)))
    assert wrong.done and wrong.reward == 0.0 and wrong.stop_reason == "answered"
    garbled = dom.make_env(task).step(Action(kind="answer", value="I am not sure"))
    assert garbled.done and garbled.reward == 0.0
    fb = dom.make_env(task).step(Action(kind="move", value="e2e4"))
    assert not fb.done and fb.feedback_kind == "format"


# ------------------------------------------------------------------ base harness


def test_math_h0_imports_and_parses() -> None:
    path = ROOT / "harnesses" / "math" / "h0.py"
    assert imported_modules(path) <= HARNESS_IMPORTS
    h0 = load_module(path)
    assert h0.MAX_TURNS == 2
    assert not getattr(h0, "SYSTEM_PROMPT", "")
    prompt = h0.USER_PROMPT.format_map({"question": "What is 2 + 3?"})
    assert prompt.startswith("What is 2 + 3?") and "\\boxed{}" in prompt
    assert h0.parse_action("so it is \\boxed{\\frac{1}{2}}.") == {
        "type": "answer",
        "content": "\\frac{1}{2}",
    }
    tool = h0.parse_action("Let me compute.\n<python>print(6 * 7)</python>")
    assert tool == {"type": "tool", "name": "python", "arguments": {"code": "print(6 * 7)"}}
    fenced = h0.parse_action("```python\nprint(1)\n```")
    assert fenced["name"] == "python" and "print(1)" in fenced["arguments"]["code"]
    assert h0.parse_action("I think it is 5") is None
    dom = MathDomain.builtin(0, SIZES)
    assert dom.normalise_action(h0.parse_action("\\boxed{5}")).kind == "answer"
    assert dom.normalise_action(h0.parse_action("nothing")).kind == "invalid"
