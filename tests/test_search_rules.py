"""The rules proposer: per failure kind, a valid candidate changing the matching surface.

Each case builds traces that show one failure kind under a real base harness h0, asks the rules
proposer for candidates, validates them with the real harness contract and sandbox, and checks the
new behaviour by calling the candidate in a harness host.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import SandboxConfig
from whale_lab.harness import HarnessHost, validate_harness
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.prompt_only import prompt_only_violation
from whale_lab.search.proposers.base import ProposalRequest
from whale_lab.search.proposers.rules import RulesProposer
from whale_lab.search.surfaces import changed_surfaces

REPO = Path(__file__).resolve().parent.parent
SANDBOX = SandboxConfig(call_timeout_s=2.0)

LONG = (
    "Trolubras Nywu was born in Glikast, a market town in the northern hills, and spent "
    "her youth there before moving to the coast, where she wrote three books about the "
    "fishing fleets and the river trade that made the town rich in the old days."
)
BOARD = """Side to move: white
FEN: 6k1/5ppp/8/8/8/8/5PPP/3Q2K1 w - - 0 1
Opponent's last move: none
Legal moves:
- [d1d8] SAN=Qd8#
- [d1d7] SAN=Qd7
- [g2g3] SAN=g3
- [h2h3] SAN=h3"""


def h0(domain: str) -> str:
    return (REPO / "harnesses" / domain / "h0.py").read_text(encoding="utf-8")


def h0_with_turns(domain: str, turns: int) -> str:
    """h0 with another MAX_TURNS: a parent whose limit leaves a rule room (or none) to act."""
    code = h0(domain)
    assert "\nMAX_TURNS = " in code
    return re.sub(r"(?m)^MAX_TURNS = \d+$", f"MAX_TURNS = {turns}", code)


def turn(
    response: str,
    kind: str,
    *,
    prompt: str = "Question: q",
    value: str = "",
    tool: str = "",
    args: dict | None = None,
    observation: Any = None,
    finish: str = "stop",
    feedback: dict | None = None,
) -> dict[str, Any]:
    return {
        "prompt": [{"role": "user", "content": prompt}],
        "response": response,
        "finish_reason": finish,
        "prompt_tokens": 50,
        "completion_tokens": 10,
        "action": {
            "kind": kind,
            "value": value,
            "tool": tool,
            "args": args or {},
            "reason": "" if kind != "invalid" else "no tag",
        },
        "observation": observation,
        "feedback": feedback,
        "tool_error": False,
    }


def trace(
    i: int, turns: list[dict[str, Any]], stop: str, reward: float = 0.0, **counts: Any
) -> dict[str, Any]:
    return {
        "task_id": f"t{i:03d}",
        "domain": "x",
        "sample": 0,
        "harness": "c000",
        "turns": turns,
        "reward": reward,
        "stop_reason": stop,
        "error": "",
        "format_failures": 0,
        "illegal_moves": 0,
        "tool_calls": 0,
        "tool_errors": 0,
        "token_cap_hits": 0,
        "info": {},
        **counts,
    }


def search_step(i: int, shown: str) -> list[dict[str, Any]]:
    obs = {"query": "Trolubras Nywu", "passages": [{"title": "Trolubras Nywu", "text": LONG}]}
    return [
        turn(
            "<search>Trolubras Nywu</search>",
            "tool",
            tool="search",
            args={"query": "Trolubras Nywu", "topk": 1},
            observation=obs,
        ),
        turn("<answer>Glikast</answer>", "answer", value="Glikast", prompt=f"Question: q\n{shown}"),
    ]


# ------------------------------------------------------------------ trace sets per failure kind


def t_search_format() -> list[dict]:
    return [
        trace(
            i,
            [turn("Answer: Mopejard River", "invalid"), turn("answer: Mopejard", "invalid")],
            "format_failure",
            format_failures=2,
        )
        for i in range(4)
    ]


def t_search_truncated() -> list[dict]:
    shown = "<information>Trolubras Nywu: Trolubras Nywu was born in Glikast, a market ...</information>"
    return [
        trace(i, search_step(i, shown), "answered", tool_calls=1, info={"retrieval_recall": True})
        for i in range(4)
    ]


def t_search_turn_cap() -> list[dict]:
    return [
        trace(
            i,
            [
                turn(
                    "<search>a</search>",
                    "tool",
                    tool="search",
                    args={"query": "a"},
                    observation={"query": "a", "passages": []},
                ),
                turn(
                    "<search>b</search>",
                    "tool",
                    tool="search",
                    args={"query": "b"},
                    observation={"query": "b", "passages": []},
                ),
            ],
            "turn_cap",
            tool_calls=2,
        )
        for i in range(4)
    ]


def t_search_one_search() -> list[dict]:
    return [
        trace(
            i,
            [
                turn(
                    "<search>x</search>",
                    "tool",
                    tool="search",
                    args={"query": "x"},
                    observation={"query": "x", "passages": []},
                ),
                turn(
                    "<answer>Glikast</answer>",
                    "answer",
                    value="Glikast",
                    prompt="Question: q\n<information>No results.</information>",
                ),
            ],
            "answered",
            tool_calls=1,
        )
        for i in range(4)
    ]


def t_search_length() -> list[dict]:
    return [
        trace(
            i,
            [
                turn(
                    "<answer>Glikast</answer> because " + "x " * 40,
                    "answer",
                    value="Glikast",
                    finish="length",
                )
            ],
            "answered",
            reward=1.0,
            token_cap_hits=1,
        )
        for i in range(4)
    ]


def t_search_context() -> list[dict]:
    return [
        trace(
            i,
            [
                turn(
                    "<search>x</search>",
                    "tool",
                    tool="search",
                    args={"query": "x"},
                    observation={"query": "x", "passages": []},
                )
            ],
            "token_cap",
            tool_calls=1,
        )
        for i in range(3)
    ]


def t_math_tool_error() -> list[dict]:
    obs = {
        "code": "print(x)",
        "stdout": "",
        "error": "Traceback (most recent call last):\nNameError: name 'x' is not defined",
    }
    return [
        trace(
            i,
            [
                turn(
                    "<python>print(x)</python>",
                    "tool",
                    tool="python",
                    args={"code": "print(x)"},
                    observation=obs,
                ),
                turn("\\boxed{3}", "answer", value="3"),
            ],
            "answered",
            tool_calls=1,
            tool_errors=1,
        )
        for i in range(4)
    ]


def t_math_fenced() -> list[dict]:
    code = "```python\nprint(6*7)\n```"
    obs = {"code": code, "stdout": "", "error": "SyntaxError: invalid syntax"}
    return [
        trace(
            i,
            [
                turn(
                    f"<python>{code}</python>",
                    "tool",
                    tool="python",
                    args={"code": code},
                    observation=obs,
                ),
                turn("\\boxed{42}", "answer", value="42"),
            ],
            "answered",
            reward=1.0,
            tool_calls=1,
            tool_errors=1,
        )
        for i in range(4)
    ]


def t_math_format() -> list[dict]:
    return [
        trace(i, [turn("6 * 7 = 42\n#### 42", "invalid")], "format_failure", format_failures=2)
        for i in range(4)
    ]


def t_math_no_tool() -> list[dict]:
    return [
        trace(i, [turn("It is \\boxed{41}", "answer", value="41")], "answered") for i in range(4)
    ]


def t_chess_wrong() -> list[dict]:
    return [
        trace(i, [turn("<move>d1d7</move>", "move", value="d1d7", prompt=BOARD)], "wrong_move")
        for i in range(4)
    ]


def t_chess_illegal() -> list[dict]:
    fb = {"kind": "illegal", "detail": "e2e4 is not legal here"}
    return [
        trace(
            i,
            [
                turn("<move>e2e4</move>", "move", value="e2e4", prompt=BOARD, feedback=fb),
                turn("<move>e2e5</move>", "move", value="e2e5", prompt=BOARD, feedback=fb),
            ],
            "illegal_moves",
            illegal_moves=2,
        )
        for i in range(4)
    ]


def t_chess_format() -> list[dict]:
    return [
        trace(
            i,
            [turn("I play d1d8 here.", "invalid", prompt=BOARD)],
            "format_failure",
            format_failures=2,
        )
        for i in range(4)
    ]


# ------------------------------------------------------------------ behaviour checks


def _host(path: Path, domain: str) -> HarnessHost:
    return HarnessHost(path, domain, SANDBOX)


def _parse(path: Path, domain: str, *responses: str) -> list[Any]:
    with _host(path, domain) as host:
        res = host.parse(
            [{"response": r, "context": {"turn_count": 1, "max_turns": 4}} for r in responses]
        )
    assert all(r.ok for r in res), [r.error for r in res]
    return [r.value for r in res]


def _render(
    path: Path,
    domain: str,
    history: list[dict],
    turn_count: int = 2,
    max_turns: int = 4,
    fields: dict | None = None,
) -> list[dict]:
    with _host(path, domain) as host:
        (res,) = host.render(
            [
                {
                    "fields": fields or {"question": "Where was T. N. born?"},
                    "history": history,
                    "context": {"turn_count": turn_count, "max_turns": max_turns},
                }
            ]
        )
    assert res.ok, res.error
    return res.value


def _obs(o: Any) -> dict:
    return {"type": "observation", "observation": o}


def check_lenient_search(path: Path, code: str) -> None:
    a, b, c = _parse(
        path,
        "search",
        "Answer: Mopejard River",
        "<answer>Glikast</answer>",
        "<search>Glikast river</search>",
    )
    assert a == {"type": "answer", "content": "Mopejard River"}
    assert b == {"type": "answer", "content": "Glikast"}  # the parent's parser still runs first
    assert c["type"] == "tool" and c["arguments"]["query"] == "Glikast river"


def check_more_evidence(path: Path, code: str) -> None:
    passages = [{"title": f"Title {i}", "text": LONG} for i in range(3)]
    msgs = _render(
        path,
        "search",
        [
            _obs(None),
            {"type": "response", "text": "<search>x</search>"},
            _obs({"query": "x", "passages": passages}),
        ],
    )
    shown = msgs[-1]["content"]
    assert all(f"Title {i}" in shown for i in range(3)) and "made the town rich" in shown
    (call,) = _parse(path, "search", "<search>Glikast</search>")
    assert call["arguments"]["topk"] == 3


def check_turn_budget(path: Path, code: str) -> None:
    with _host(path, "search") as host:
        assert host.info.max_turns == 4
    msgs = _render(path, "search", [_obs(None)], turn_count=4, max_turns=4)
    assert "last reply" in msgs[-1]["content"] and "(Reply 4 of 4.)" in msgs[-1]["content"]


def check_search_again(path: Path, code: str) -> None:
    obs = {"query": "x", "passages": [{"title": "A", "text": "B"}]}
    msgs = _render(
        path,
        "search",
        [_obs(None), {"type": "response", "text": "<search>x</search>"}, _obs(obs)],
        turn_count=2,
        max_turns=4,
    )
    assert "search again" in msgs[-1]["content"]


def check_brevity(path: Path, code: str) -> None:
    with _host(path, "search") as host:
        assert "Keep every reply short" in host.info.system_prompt


def check_context_window(path: Path, code: str) -> None:
    hist = [_obs(None)]
    for i in range(6):
        hist += [
            {"type": "response", "text": f"<search>q{i}</search>"},
            _obs({"query": f"q{i}", "passages": []}),
        ]
    msgs = _render(path, "search", hist, turn_count=7, max_turns=10)
    assert [m["role"] for m in msgs] == ["user", "user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Answer the question.")
    assert msgs[1]["content"] == "(8 earlier messages omitted.)"
    assert msgs[-2]["content"] == "<search>q5</search>"


def check_tool_error_view(path: Path, code: str) -> None:
    obs = {"code": "print(x)", "stdout": "", "error": "Traceback\nNameError: name 'x'"}
    msgs = _render(
        path,
        "math",
        [_obs(None), {"type": "response", "text": "<python>x</python>"}, _obs(obs)],
        fields={"question": "6*7?"},
    )
    assert msgs[-1]["content"].startswith("The tool call failed: NameError: name 'x'")
    assert "<python>print(12 * 7)</python>" in msgs[-1]["content"]
    ok = _render(
        path,
        "math",
        [
            _obs(None),
            {"type": "response", "text": "<python>1</python>"},
            _obs({"code": "1", "stdout": "42", "error": ""}),
        ],
        fields={"question": "6*7?"},
    )
    assert "stdout: 42" in ok[-1]["content"]  # unchanged contract-default rendering


def check_arg_cleanup(path: Path, code: str) -> None:
    (call,) = _parse(path, "math", "<python>```python\nprint(6*7)\n```</python>")
    assert call["arguments"]["code"] == "print(6*7)"


def check_lenient_math(path: Path, code: str) -> None:
    a, b = _parse(path, "math", "6 * 7 = 42\n#### 42", "so \\boxed{42}")
    assert a == {"type": "answer", "content": "42"} and b == {"type": "answer", "content": "42"}


def check_tool_prompt(path: Path, code: str) -> None:
    with _host(path, "math") as host:
        assert "<python>" in host.info.system_prompt and "\\boxed" in host.info.system_prompt


def check_annotate(path: Path, code: str) -> None:
    msgs = _render(path, "chess", [_obs(BOARD)], turn_count=1, max_turns=9, fields={})
    text = msgs[-1]["content"]
    assert "- [d1d8] SAN=Qd8#  (mate)" in text and "- [g2g3] SAN=g3\n" in text
    assert "Forcing moves (checks, captures, promotions): d1d8 mate" in text


def check_illegal_feedback(path: Path, code: str) -> None:
    hist = [
        _obs(BOARD),
        {"type": "response", "text": "<move>e2e4</move>"},
        {"type": "feedback", "kind": "illegal", "detail": "e2e4 is not legal"},
    ]
    msgs = _render(path, "chess", hist, turn_count=2, max_turns=9, fields={})
    assert msgs[-1]["content"].startswith("e2e4 is not legal That move is not legal")
    with _host(path, "chess") as host:
        assert host.info.illegal_move_retry_budget == 2


def check_lenient_chess(path: Path, code: str) -> None:
    a, b, c = _parse(path, "chess", "I play d1d8 here.", "<move>d1d8</move>", "d1d8 or d1d7")
    assert (a, b, c) == ("d1d8", "d1d8", "__no_move__")


CASES: list[tuple[str, str, Callable[[], list[dict]], str, str, Callable[[Path, str], None]]] = [
    ("search", "format", t_search_format, "lenient_parser", "parser", check_lenient_search),
    ("search", "truncated", t_search_truncated, "more_evidence", "tool_io", check_more_evidence),
    (
        "search",
        "turn_cap",
        t_search_turn_cap,
        "turn_budget_stop_rule",
        "termination",
        check_turn_budget,
    ),
    (
        "search",
        "one_search",
        t_search_one_search,
        "search_again_rule",
        "tool_io",
        check_search_again,
    ),
    ("search", "length", t_search_length, "brevity_prompt", "prompts", check_brevity),
    (
        "search",
        "context",
        t_search_context,
        "recent_context_window",
        "context",
        check_context_window,
    ),
    ("math", "tool_error", t_math_tool_error, "tool_error_view", "tool_io", check_tool_error_view),
    ("math", "fenced_args", t_math_fenced, "tool_argument_cleanup", "parser", check_arg_cleanup),
    ("math", "format", t_math_format, "lenient_parser", "parser", check_lenient_math),
    ("math", "no_tool", t_math_no_tool, "tool_use_prompt", "prompts", check_tool_prompt),
    ("chess", "wrong_move", t_chess_wrong, "annotate_legal_moves", "tool_io", check_annotate),
    (
        "chess",
        "illegal",
        t_chess_illegal,
        "illegal_move_feedback",
        "feedback",
        check_illegal_feedback,
    ),
    ("chess", "format", t_chess_format, "lenient_parser", "parser", check_lenient_chess),
]


def _archive(
    tmp_path: Path, domain: str, traces: list[dict], rate: float = 0.0, code: str | None = None
) -> PhaseArchive:
    archive = PhaseArchive(tmp_path / "phase")
    cid = archive.add_candidate(
        h0(domain) if code is None else code,
        parent_id="",
        hypothesis="incoming",
        surface="",
        proposer="incoming",
        iteration=1,
    )
    archive.write_traces(cid, traces)
    archive.write_json(
        cid,
        "scores",
        {"success_rate": rate, "mean_turns": 2.0, "tokens": 100, "rollouts": len(traces)},
    )
    archive.set_status(cid, "evaluated")
    return archive


def _request(
    archive: PhaseArchive,
    domain: str,
    n: int,
    *,
    prompt_only: bool = False,
    parent: str = "c000",
    iteration: int = 2,
) -> ProposalRequest:
    return ProposalRequest(
        archive=archive,
        n=n,
        domain=domain,
        iteration=iteration,
        prompt_only=prompt_only,
        default_parent=parent,
    )


# Cases whose rule needs more turns than h0's MAX_TURNS = 2 to act (a context window cuts nothing
# before turn 4; a retried tool call is read on turn 3): their parent is h0 with room to act.
# tests/test_search_rules_limits.py checks that on h0 itself these rules are not proposed.
PARENT_TURNS = {("search", "context"): 6, ("math", "tool_error"): 4}


def case_parent(domain: str, kind: str) -> str:
    turns = PARENT_TURNS.get((domain, kind))
    return h0(domain) if turns is None else h0_with_turns(domain, turns)


@pytest.mark.parametrize(
    ("domain", "kind", "make", "mechanism", "surface", "check"),
    CASES,
    ids=[f"{c[0]}-{c[1]}" for c in CASES],
)
def test_rules_candidate_per_failure_kind(
    tmp_path: Path, domain: str, kind: str, make, mechanism: str, surface: str, check
) -> None:
    parent = case_parent(domain, kind)
    archive = _archive(tmp_path, domain, make(), code=parent)
    session = RulesProposer().propose(_request(archive, domain, n=2))
    assert session.error == ""
    by_name = {c.mechanism: c for c in session.candidates}
    assert mechanism in by_name, [c.mechanism for c in session.candidates]
    cand = by_name[mechanism]
    assert cand.surface == surface and cand.parent_id == "c000"
    assert surface in changed_surfaces(parent, cand.code)
    assert cand.cited_traces and cand.cited_traces[0].startswith("c000/t")
    assert "Evidence (c000: " in cand.hypothesis and cand.cited_traces[0] in cand.hypothesis
    assert cand.code != parent
    path = tmp_path / f"{mechanism}.py"
    path.write_text(cand.code, encoding="utf-8")
    result = validate_harness(path, domain, SANDBOX)
    assert result.ok, result.reason
    check(path, cand.code)


def test_prompt_only_mode_changes_prompts_only(tmp_path: Path) -> None:
    traces = t_search_format() + t_search_turn_cap() + t_search_one_search()
    archive = _archive(tmp_path, "search", traces)
    session = RulesProposer().propose(_request(archive, "search", n=3, prompt_only=True))
    assert len(session.candidates) == 3
    for cand in session.candidates:
        assert cand.surface == "prompts"
        assert prompt_only_violation(h0("search"), cand.code) is None


def test_iterations_propose_different_candidates_and_read_rejections(tmp_path: Path) -> None:
    traces = t_search_format() + t_search_truncated() + t_search_turn_cap() + t_search_one_search()
    archive = _archive(tmp_path, "search", traces, rate=0.25)
    proposer = RulesProposer()
    first = proposer.propose(_request(archive, "search", n=3))
    names1 = [c.mechanism for c in first.candidates]
    assert len(set(names1)) == 3
    ids = []
    for cand in first.candidates:
        ids.append(
            archive.add_candidate(
                cand.code,
                parent_id=cand.parent_id,
                hypothesis=cand.hypothesis,
                surface=cand.surface,
                proposer="rules",
                iteration=2,
                mechanism=cand.mechanism,
            )
        )
    parser_id = next(i for i, c in zip(ids, first.candidates, strict=True) if c.surface == "parser")
    others = [i for i in ids if i != parser_id]
    archive.write_json(
        parser_id,
        "decision",
        {"decision": "reject", "reason": "no parser changes, fix the prompts"},
    )
    archive.set_status(parser_id, "rejected", "no parser changes, fix the prompts")
    archive.write_json(others[0], "scores", {"success_rate": 0.5, "mean_turns": 2.0})
    archive.set_status(others[0], "evaluated")
    archive.write_json(others[1], "scores", {"success_rate": 0.1, "mean_turns": 2.0})
    archive.set_status(others[1], "evaluated")
    archive.write_traces(others[0], traces)
    assert archive.best() == others[0]

    second = proposer.propose(_request(archive, "search", n=3, parent=others[0], iteration=3))
    names2 = [c.mechanism for c in second.candidates]
    assert names2 and not set(names2) & set(names1)
    assert all(c.surface != "parser" for c in second.candidates)
    assert all(c.parent_id == others[0] for c in second.candidates)
    assert "no parser changes" in second.candidates[0].hypothesis
    for cand in second.candidates:
        path = tmp_path / f"{cand.mechanism}.py"
        path.write_text(cand.code, encoding="utf-8")
        assert validate_harness(path, "search", SANDBOX).ok


def test_nothing_to_propose_is_a_note_not_an_error(tmp_path: Path) -> None:
    solved = [
        trace(i, [turn("<answer>A</answer>", "answer", value="A")], "answered", reward=1.0)
        for i in range(3)
    ]
    archive = _archive(tmp_path, "search", solved, rate=1.0)
    session = RulesProposer().propose(_request(archive, "search", n=2))
    assert session.candidates == () and session.error == ""
    assert "0 untried mechanism" in session.note
