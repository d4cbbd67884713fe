"""Rules whose effect depends on a limit of the parent harness are proposed only where they can act.

A tool result or feedback message is shown on the turn after the reply that caused it, so a rule
that acts through one needs that turn; a context window of 4 messages cuts nothing before turn 4.
For each such rule: a parent whose limit leaves it no room gets no such candidate, or gets one
that raises the limit (read back from the produced code with `ast` and from a harness host).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
from test_search_rules import (
    SANDBOX,
    _archive,
    _obs,
    _render,
    _request,
    h0,
    h0_with_turns,
    t_chess_illegal,
    t_math_fenced,
    t_math_no_tool,
    t_math_tool_error,
    t_search_context,
    t_search_format,
    t_search_one_search,
    t_search_truncated,
)

from whale_lab.harness import HarnessHost, validate_harness
from whale_lab.search.proposers.base import ProposedCandidate
from whale_lab.search.proposers.rules import CATALOG, RulesProposer
from whale_lab.search.proposers.rules.common import parent_limit
from whale_lab.search.proposers.rules.draw import DrawProposer


def constant(code: str, name: str) -> Any:
    """The literal value of the last top-level `name = ...` in `code` (None when absent)."""
    value = None
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            value = ast.literal_eval(node.value)
    return value


def with_constant(code: str, name: str, value: int) -> str:
    """`code` with `name = value`: the line replaced if there is one, else added after MAX_TURNS."""
    line = f"{name} = {value}"
    if re.search(rf"(?m)^{name} = ", code):
        return re.sub(rf"(?m)^{name} = .*$", line, code)
    return re.sub(r"(?m)^(MAX_TURNS = \d+)$", rf"\1\n{line}", code)


def proposals(
    tmp_path: Path, domain: str, traces: list[dict], parent: str
) -> dict[str, ProposedCandidate]:
    """Every candidate the rules proposer finds evidence for on `parent`, by mechanism."""
    archive = _archive(tmp_path, domain, traces, code=parent)
    session = RulesProposer().propose(_request(archive, domain, n=len(CATALOG)))
    assert session.error == ""
    assert all(c.parent_id == "c000" for c in session.candidates)
    return {c.mechanism: c for c in session.candidates}


def valid(tmp_path: Path, domain: str, cand: ProposedCandidate) -> Path:
    path = tmp_path / f"{cand.mechanism}.py"
    path.write_text(cand.code, encoding="utf-8")
    result = validate_harness(path, domain, SANDBOX)
    assert result.ok, result.reason
    return path


def max_turns_of(path: Path, domain: str) -> int:
    with HarnessHost(path, domain, SANDBOX) as host:
        return int(host.info.max_turns)


def test_parent_limit_reads_the_source_without_running_it() -> None:
    code = h0("search")
    assert parent_limit(code, "MAX_TURNS") == 2
    assert parent_limit(code, "FORMAT_RETRY_BUDGET") == 1  # absent: the contract default
    assert parent_limit(code.replace("MAX_TURNS = 2", "MAX_TURNS = 1 + 2"), "MAX_TURNS") is None
    assert parent_limit(code.replace("MAX_TURNS = 2", "MAX_TURNS = True"), "MAX_TURNS") is None
    assert parent_limit(code.replace("MAX_TURNS = 2", "MAX_TURNS: int = 7"), "MAX_TURNS") == 7


# ------------------------------------------------------------------ search_again_rule: raise


def test_search_again_raises_max_turns_where_the_parent_leaves_no_turn_for_it(
    tmp_path: Path,
) -> None:
    parent = h0("search")  # MAX_TURNS = 2: turn 1 has no result, turn 2 is the last
    assert constant(parent, "MAX_TURNS") == 2
    cand = proposals(tmp_path, "search", t_search_one_search(), parent)["search_again_rule"]
    assert constant(cand.code, "MAX_TURNS") == 3
    assert "MAX_TURNS goes 2 -> 3" in cand.hypothesis
    assert "MAX_TURNS=2 leaves no turn" in cand.hypothesis
    path = valid(tmp_path, "search", cand)
    assert max_turns_of(path, "search") == 3
    history = [
        _obs(None),
        {"type": "response", "text": "<search>x</search>"},
        _obs({"query": "x", "passages": [{"title": "A", "text": "B"}]}),
    ]
    # Under the parent's cap the hint would never be shown; under the raised one, turn 2 has it.
    assert "search again" not in _render(path, "search", history, 2, 2)[-1]["content"]
    assert "search again" in _render(path, "search", history, 2, 3)[-1]["content"]


@pytest.mark.parametrize("turns", [3, 5])
def test_search_again_keeps_a_parent_max_turns_that_has_room(tmp_path: Path, turns: int) -> None:
    parent = h0_with_turns("search", turns)
    cand = proposals(tmp_path, "search", t_search_one_search(), parent)["search_again_rule"]
    assert constant(cand.code, "MAX_TURNS") == turns
    assert "MAX_TURNS goes" not in cand.hypothesis
    assert "search again" in cand.code


# ------------------------------------------------------------------ declines on too few turns


DECLINES = [
    # (mechanism, domain, traces, MAX_TURNS with no room, MAX_TURNS with room)
    ("more_evidence", "search", t_search_truncated, 1, 2),
    ("tool_argument_cleanup", "math", t_math_fenced, 1, 2),
    ("tool_error_view", "math", t_math_tool_error, 2, 3),
    ("recent_context_window", "search", t_search_context, 3, 4),
    ("tool_use_prompt", "math", t_math_no_tool, 1, 2),
    ("format_feedback_example", "search", t_search_format, 1, 2),
    ("illegal_move_feedback", "chess", t_chess_illegal, 1, 2),
]


@pytest.mark.parametrize(
    ("mechanism", "domain", "make", "short", "room"), DECLINES, ids=[d[0] for d in DECLINES]
)
def test_rule_is_not_proposed_where_max_turns_leaves_it_no_room(
    tmp_path: Path, mechanism: str, domain: str, make, short: int, room: int
) -> None:
    no_room = proposals(tmp_path / "short", domain, make(), h0_with_turns(domain, short))
    assert mechanism not in no_room, sorted(no_room)
    with_room = proposals(tmp_path / "room", domain, make(), h0_with_turns(domain, room))
    assert mechanism in with_room, sorted(with_room)
    cand = with_room[mechanism]
    assert constant(cand.code, "MAX_TURNS") == room  # a declining rule never touches the limit
    valid(tmp_path, domain, cand)


def test_rules_that_need_no_extra_turn_still_act_on_a_single_turn_parent(tmp_path: Path) -> None:
    """Only the rules that need a later turn drop out; a parser or prompt fix acts on turn 1."""
    found = proposals(tmp_path, "search", t_search_format(), h0_with_turns("search", 1))
    assert {"lenient_parser", "format_prompt_example"} <= set(found)
    assert "format_feedback_example" not in found


def test_context_window_is_declined_on_h0_but_drawn_where_it_cuts(tmp_path: Path) -> None:
    """The best-of-n control draws from the same finders, so it cannot draw a no-op either."""

    def drawn(parent: str, where: Path) -> set[str]:
        archive = _archive(where, "search", t_search_context(), code=parent)
        session = DrawProposer(seed=0).propose(_request(archive, "search", n=len(CATALOG)))
        return {c.mechanism for c in session.candidates}

    assert "recent_context_window" not in drawn(h0("search"), tmp_path / "h0")
    assert "recent_context_window" in drawn(h0_with_turns("search", 6), tmp_path / "six")


def test_search_tool_prompt_asks_for_a_second_search_only_with_a_turn_for_it(
    tmp_path: Path,
) -> None:
    two = proposals(tmp_path / "two", "search", t_search_one_search(), h0("search"))
    three = proposals(
        tmp_path / "three", "search", t_search_one_search(), h0_with_turns("search", 3)
    )
    prompt_two = constant(two["tool_use_prompt"].code, "SYSTEM_PROMPT")
    prompt_three = constant(three["tool_use_prompt"].code, "SYSTEM_PROMPT")
    assert "Look things up before answering" in prompt_two
    assert "search for that entity too" not in prompt_two
    assert "search for that entity too" in prompt_three


# ------------------------------------------------------------------ retry budgets: raise, never lower


@pytest.mark.parametrize(
    ("budget", "expected", "says"),
    [
        (None, 2, "FORMAT_RETRY_BUDGET goes 1 -> 2"),  # absent: the contract default, 1
        (0, 2, "FORMAT_RETRY_BUDGET goes 0 -> 2"),  # 0 ends the episode on the first slip
        (4, 5, "FORMAT_RETRY_BUDGET goes 4 -> 5"),
        (10, 10, "FORMAT_RETRY_BUDGET stays at 10"),
        (20, 20, "FORMAT_RETRY_BUDGET stays at 20"),  # was cut to 10 before
    ],
)
def test_format_feedback_raises_the_retry_budget_and_never_lowers_it(
    tmp_path: Path, budget: int | None, expected: int, says: str
) -> None:
    parent = h0("search")
    if budget is not None:
        parent = with_constant(parent, "FORMAT_RETRY_BUDGET", budget)
    assert constant(parent, "FORMAT_RETRY_BUDGET") == budget
    cand = proposals(tmp_path, "search", t_search_format(), parent)["format_feedback_example"]
    assert constant(cand.code, "FORMAT_RETRY_BUDGET") == expected
    assert says in cand.hypothesis
    path = valid(tmp_path, "search", cand)
    with HarnessHost(path, "search", SANDBOX) as host:
        assert host.info.format_retry_budget == expected


@pytest.mark.parametrize(("budget", "expected"), [(0, 2), (1, 2), (10, 10)])
def test_illegal_move_feedback_raises_the_retry_budget_and_never_lowers_it(
    tmp_path: Path, budget: int, expected: int
) -> None:
    parent = with_constant(h0("chess"), "ILLEGAL_MOVE_RETRY_BUDGET", budget)
    cand = proposals(tmp_path, "chess", t_chess_illegal(), parent)["illegal_move_feedback"]
    assert constant(cand.code, "ILLEGAL_MOVE_RETRY_BUDGET") == expected
    assert constant(cand.code, "MAX_TURNS") == 9
    valid(tmp_path, "chess", cand)
