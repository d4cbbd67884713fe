"""What every rule shares: the parent's reply format, the rule context, findings, mechanisms.

Each surface module builds its rules from these; the small text helpers keep the evidence and
the edited prompts worded the same way across rules, and the limit helpers read the parent's
MAX_TURNS and retry budgets so that no rule is proposed where those limits leave it nothing to do.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale_lab.harness.surfaces import SURFACES
from whale_lab.search.codeedit import find_top_level, get_constant, set_constant, string_constant
from whale_lab.search.trace_stats import FailureStats

DEFAULT_TOOLS = {"search": ("search", "query"), "math": ("python", "code")}

# A feedback rule raises its retry budget to at least this, so one retry can read the feedback,
# and to at most RETRY_BUDGET_CAP (the chess contract's cap); it never lowers a budget.
MIN_RETRY_BUDGET = 2
RETRY_BUDGET_CAP = 10


@dataclass
class FormatSpec:
    """The reply format the parent asks for, read from its prompts and from valid replies."""

    domain: str
    answer_tag: str = ""
    boxed: bool = False
    tool_tag: str = ""
    tool: tuple[str, str] | None = None

    @property
    def answer_form(self) -> str:
        if self.domain == "chess":
            return f"<{self.answer_tag or 'move'}>e2e4</{self.answer_tag or 'move'}>"
        if self.boxed and not self.answer_tag:
            return "\\boxed{your answer}"
        tag = self.answer_tag or "answer"
        return f"<{tag}>your final answer</{tag}>"

    @property
    def tool_form(self) -> str:
        if not self.tool:
            return ""
        tag = self.tool_tag or self.tool[0]
        what = "code that prints the result" if self.tool[1] == "code" else f"your {self.tool[1]}"
        return f"<{tag}>{what}</{tag}>"

    def example(self) -> str:
        if self.domain == "chess":
            return (
                f"Reply with exactly one move in UCI notation inside the tag, for example "
                f"{self.answer_form}, choosing it from the legal-move list."
            )
        if self.tool:
            return (
                f"Reply with exactly one of: {self.tool_form} to use the {self.tool[0]} tool, "
                f"or {self.answer_form} to finish."
            )
        return f"Reply with your final answer in this form: {self.answer_form}."


def _prompt_text(code: str) -> str:
    return string_constant(code, "SYSTEM_PROMPT") + "\n" + string_constant(code, "USER_PROMPT")


def format_spec(domain: str, code: str, stats: FailureStats) -> FormatSpec:
    prompts = _prompt_text(code)
    # Tags the prompts mention first, then any the code itself reads (e.g. a parser's regex).
    prompt_tags = [
        t.lower() for t in re.findall(r"<\s*([A-Za-z_][\w-]*)\s*>", prompts + "\n" + code)
    ]
    spec = FormatSpec(domain=domain, boxed="boxed" in prompts)
    known = set(prompt_tags)
    tool_words = {"search", "python", "code", "tool", "query"}
    spec.tool = stats.main_tool() or DEFAULT_TOOLS.get(domain)
    if spec.tool and not spec.tool[0]:
        spec.tool = DEFAULT_TOOLS.get(domain)
    if spec.tool:
        tool_words.add(spec.tool[0])
    used_tool_tags = [t for t, _n in stats.tool_tags.most_common() if t in known]
    if used_tool_tags:
        spec.tool_tag = used_tool_tags[0]
    elif spec.tool:
        spec.tool_tag = next((t for t in prompt_tags if t in tool_words), "")
    used_answer_tags = [
        t
        for t, _n in stats.answer_tags.most_common()
        if t in known and t not in tool_words and t != spec.tool_tag
    ]
    if used_answer_tags:
        spec.answer_tag = used_answer_tags[0]
    elif domain == "chess":
        spec.answer_tag = "move"
    elif "answer" in known or domain == "search":
        spec.answer_tag = "answer"
    if domain == "math" and spec.tool and not stats.tool_usage and not spec.tool_tag:
        spec.tool = None  # the parent never mentions or uses the interpreter
    return spec


@dataclass
class RuleContext:
    domain: str
    parent_id: str
    parent_code: str
    stats: FailureStats
    spec: FormatSpec
    shown_text: str  # a sample of what the model was shown (to detect legal-move lists)


@dataclass(frozen=True)
class Finding:
    """Evidence that a mechanism applies: how many episodes/turns, out of how many, which traces."""

    count: int
    total: int
    cited: tuple[str, ...]
    evidence: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Mechanism:
    name: str
    surface: str
    title: str
    domains: tuple[str, ...]  # empty: every domain
    find: Callable[[RuleContext], Finding | None]
    build: Callable[[RuleContext, Finding], tuple[str, str]]  # -> (code, change description)
    expected: str

    def applies_to(self, domain: str) -> bool:
        return not self.domains or domain in self.domains


def quote(s: str) -> str:
    return repr(s)


def add_to_system_prompt(code: str, text: str) -> str:
    old = string_constant(code, "SYSTEM_PROMPT")
    new = (old.rstrip() + "\n\n" + text) if old.strip() else text
    return set_constant(code, "SYSTEM_PROMPT", new)


def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else f"{a}/0"


def short(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def parent_limit(code: str, name: str) -> int | None:
    """The parent's value of an int surface (MAX_TURNS, a retry budget), read with `ast`, never run.

    Absent: the contract default, which is what the runtime uses. Bound to something that is not
    an int literal: None, so that a rule never declines or raises on a guess.
    """
    if find_top_level(code, name) is None:
        return int(SURFACES[name].default)
    value = get_constant(code, name, None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def too_few_turns(ctx: RuleContext, need: int) -> bool:
    """True when the parent's MAX_TURNS is known and below `need`: the rule could not act there.

    A tool result or a feedback message is shown on the turn after the one that caused it, so a
    rule that acts through one needs that next turn to exist.
    """
    turns = parent_limit(ctx.parent_code, "MAX_TURNS")
    return turns is not None and turns < need


def raise_retry_budget(code: str, name: str) -> tuple[str, str]:
    """Raise a retry budget so the feedback a rule adds is read on a retry; never lower it.

    Returns the edited code and the clause that says what happened to the budget.
    """
    known = parent_limit(code, name)
    budget = int(SURFACES[name].default) if known is None else known
    new = max(budget, min(RETRY_BUDGET_CAP, max(budget + 1, MIN_RETRY_BUDGET)))
    if new == budget and known is not None:
        return code, f"{name} stays at {budget}, which already allows retries"
    return set_constant(code, name, new), f"{name} goes {budget} -> {new}"
