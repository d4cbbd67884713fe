"""The prompt-only rule compares a candidate with h0: docstrings and annotations never count."""

from __future__ import annotations

from whale_lab.search.prompt_only import prompt_only_violation

H0 = '''"""h0."""
SYSTEM_PROMPT = "Solve it."
USER_PROMPT = "{question}"
MAX_TURNS: int = 4


def parse_action(response):
    """Take the last line."""
    return response.strip().splitlines()[-1] if response.strip() else None
'''


def test_only_prompt_text_may_change() -> None:
    ok = H0.replace("Solve it.", "Solve it step by step.").replace('"{question}"', '"Q: {question}"')
    assert prompt_only_violation(H0, ok) is None


def test_docstrings_and_annotations_do_not_count() -> None:
    edited = H0.replace('"""h0."""', '"""A new module docstring."""').replace(
        '"""Take the last line."""', '"""Another docstring."""'
    ).replace("MAX_TURNS: int = 4", "MAX_TURNS = 4")
    assert prompt_only_violation(H0, edited) is None
    no_doc = H0.replace('    """Take the last line."""\n', "")
    assert prompt_only_violation(H0, no_doc) is None


def test_a_behaviour_change_is_named_even_when_the_parent_already_drifted() -> None:
    drifted = H0.replace("MAX_TURNS: int = 4", "MAX_TURNS: int = 8")
    reason = prompt_only_violation(H0, drifted)
    assert reason is not None and "MAX_TURNS" in reason and "h0" in reason
    # compared with its drifted parent it would pass; compared with h0 it does not
    assert prompt_only_violation(drifted, drifted) is None
    parser = H0.replace("splitlines()[-1]", "splitlines()[0]")
    assert "parse_action" in (prompt_only_violation(H0, parser) or "")


def test_a_prompt_built_from_code_is_refused() -> None:
    bad = H0.replace('SYSTEM_PROMPT = "Solve it."', 'SYSTEM_PROMPT = "Solve" + " it."')
    assert "plain string constant" in (prompt_only_violation(H0, bad) or "")
