"""validate_harness: static check, load, type checks, the WHALE chess contract, smoke calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from whale_lab.config import SandboxConfig
from whale_lab.harness import CHESS_ALLOWED_IMPORTS, validate_harness
from whale_lab.harness.chess_contract import sample_boards

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures" / "harnesses"
SANDBOX = SandboxConfig(call_timeout_s=1.0, memory_mb=512)


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.py"


def test_general_harnesses_validate_with_their_info() -> None:
    result = validate_harness(fixture("prompt_only"), "math", SANDBOX)
    assert result.ok and result.reason == "" and result.problems == ()
    assert result.info is not None and result.info.name == "prompt_only"
    result = validate_harness(fixture("full_surfaces"), "search", SANDBOX)
    assert result.ok, result.reason
    assert result.info is not None and result.info.stop_sequences == ("</answer>",)


def test_bad_files_give_a_reason_not_an_exception(tmp_path: Path) -> None:
    result = validate_harness(fixture("bad_import_os"), "math", SANDBOX)
    assert not result.ok and result.info is None
    assert result.reason.startswith(f"{fixture('bad_import_os')}:3: ")
    assert "forbidden import 'os'" in result.reason
    result = validate_harness(fixture("bad_module_raises"), "math", SANDBOX)
    assert not result.ok and "module raised ValueError" in result.reason
    result = validate_harness(tmp_path / "missing.py", "math", SANDBOX)
    assert not result.ok and "not found" in result.reason


def test_a_harness_that_fails_on_a_sample_task_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "broken_feedback.py"
    path.write_text(
        "def format_feedback(kind, detail):\n"
        "    return {'kind': kind}\n"
        "\n"
        "def parse_action(response):\n"
        "    return response.split()[99]\n"
    )
    result = validate_harness(path, "math", SANDBOX)
    assert not result.ok
    assert "render failed on a sample task: bad_type: format_feedback must return str" in (
        result.reason
    )
    assert any(
        "parse_action failed on a sample reply: exception: IndexError" in p for p in result.problems
    )


def test_chess_contract_accepts_a_conforming_module() -> None:
    result = validate_harness(fixture("chess_good"), "chess", SANDBOX)
    assert result.ok, result.problems
    assert result.info is not None and result.info.max_turns == 9


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("chess_budget11", "ILLEGAL_MOVE_RETRY_BUDGET must be an int in 0..10"),
        ("chess_no_propose", "requires a top-level function propose_action()"),
        ("chess_proposes_move", 'propose_action must return "" (the harness may not choose moves)'),
        ("chess_bad_import", "forbidden import 'json' (the WHALE chess contract allows only"),
        ("prompt_only", "requires a top-level function propose_action()"),
    ],
)
def test_chess_contract_rejects(name: str, needle: str) -> None:
    result = validate_harness(fixture(name), "chess", SANDBOX)
    assert not result.ok
    assert needle in result.reason, result.problems


def test_chess_contract_caps_turns_and_needs_the_observation(tmp_path: Path) -> None:
    good = fixture("chess_good").read_text()
    many_turns = tmp_path / "many_turns.py"
    many_turns.write_text(good.replace("MAX_TURNS = 9", "MAX_TURNS = 19"))
    result = validate_harness(many_turns, "chess", SANDBOX)
    assert not result.ok and "MAX_TURNS must be an int in 1..18" in result.reason
    blind = tmp_path / "blind.py"
    blind.write_text(good.replace("{observation}", "(the board is hidden)"))
    result = validate_harness(blind, "chess", SANDBOX)
    assert not result.ok and "USER_PROMPT must contain {observation}" in result.reason
    bool_budget = tmp_path / "bool_budget.py"
    bool_budget.write_text(good.replace("FORMAT_RETRY_BUDGET = 1", "FORMAT_RETRY_BUDGET = True"))
    result = validate_harness(bool_budget, "chess", SANDBOX)
    assert not result.ok and "FORMAT_RETRY_BUDGET must be an int" in result.reason


def test_sample_boards_are_real_positions_with_listed_legal_moves() -> None:
    boards = sample_boards()
    assert len(boards) >= 3
    for observation, context, move in boards:
        assert f"- [{move}] SAN=" in observation
        assert "FEN: " in observation
        assert context["side_to_move"] in ("white", "black")
    assert {"__future__", "re"} <= CHESS_ALLOWED_IMPORTS and "json" not in CHESS_ALLOWED_IMPORTS


@pytest.mark.parametrize("domain", ["chess", "math", "search"])
def test_shipped_base_harnesses_validate(domain: str) -> None:
    path = REPO / "harnesses" / domain / "h0.py"
    if not path.exists():
        pytest.skip(f"{path} not written yet")
    result = validate_harness(path, domain, SANDBOX)
    assert result.ok, result.problems


def test_validation_uses_a_real_task_when_given_the_domain() -> None:
    from whale_lab.config import config_from_dict

    try:
        from whale_lab.domains import make_domain

        cfg = config_from_dict(
            {"domain": {"name": "math", "splits": {"weight": 4, "harness": 2, "val": 2, "test": 2}}}
        )
        domain = make_domain(cfg)
    except Exception as exc:  # noqa: BLE001 - the math domain is optional for this module
        pytest.skip(f"math domain unavailable: {exc}")
    result = validate_harness(fixture("prompt_only"), domain, SANDBOX)
    assert result.ok, result.problems
    assert result.info is not None and result.info.domain == "math"
