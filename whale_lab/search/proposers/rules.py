"""The offline proposer: failure statistics from raw traces -> one code mechanism per candidate.

For machines with no LLM endpoint. It reads the parent's traces in the archive, counts each failure
kind (unparseable replies, format-failure endings, turn-cap hits, passages cut or hidden, tool
errors, illegal moves, wrong answers after too few searches, generations cut by the token cap,
prompts outgrowing the context) and, for the kinds it finds, writes a real change to the matching
surface: a parser that also reads the formats the model actually used, an observation format that
shows what was cut, more turns with a stop rule, feedback that shows the expected format, legal
moves annotated with checks and captures, and so on. One mechanism per candidate; the hypothesis
cites counts and trace ids. It reads what was already tried in the phase (and the reviewers'
reasons) so every iteration proposes something different.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale_lab.search.archive import SCORED_STATUSES, PhaseArchive
from whale_lab.search.codeedit import (
    append_block,
    check_syntax,
    ensure_import,
    get_constant,
    set_constant,
    string_constant,
    wrap_function,
)
from whale_lab.search.proposers.base import (
    ProposalRequest,
    ProposalSession,
    ProposedCandidate,
    ProposerUsageRecord,
)
from whale_lab.search.trace_stats import FailureStats, cite, failure_stats

_TURN_CAPS = {"chess": 18}
_DEFAULT_TURN_CAP = 10
_DEFAULT_TOOLS = {"search": ("search", "query"), "math": ("python", "code")}
_LEGAL_LINE = re.compile(r"^\s*-\s*\[[a-h][1-8][a-h][1-8][qrbn]?\]\s*SAN=\S+", re.MULTILINE)


# ---------------------------------------------------------------------------- context


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
    spec.tool = stats.main_tool() or _DEFAULT_TOOLS.get(domain)
    if spec.tool and not spec.tool[0]:
        spec.tool = _DEFAULT_TOOLS.get(domain)
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


def _q(s: str) -> str:
    return repr(s)


def _add_to_system_prompt(code: str, text: str) -> str:
    old = string_constant(code, "SYSTEM_PROMPT")
    new = (old.rstrip() + "\n\n" + text) if old.strip() else text
    return set_constant(code, "SYSTEM_PROMPT", new)


def _pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.0f}%)" if b else f"{a}/0"


# ---------------------------------------------------------------------------- parser


def _parser_patterns(ctx: RuleContext) -> list[tuple[str, str, str, str]]:
    """(name, description, regex, kind) candidates for what unparseable replies contain."""
    spec = ctx.spec
    out: list[tuple[str, str, str, str]] = []
    if ctx.domain == "chess":
        tag = re.escape(spec.answer_tag or "move")
        out.append(
            (
                "move_tag_loose",
                f"a move in a <{spec.answer_tag or 'move'}> tag with other "
                "case, spacing or no closing tag",
                rf"<\s*{tag}\s*>\s*([a-h][1-8][a-h][1-8][qrbn]?)",
                "move",
            )
        )
        out.append(
            (
                "bare_uci",
                "exactly one bare UCI move without the tag",
                r"\b([a-h][1-8][a-h][1-8][qrbn]?)\b",
                "move_unique",
            )
        )
        return out
    if spec.tool:
        ttag = re.escape(spec.tool_tag or spec.tool[0])
        out.append(
            (
                "tool_tag_loose",
                f"a <{spec.tool_tag or spec.tool[0]}> call with other case or "
                "spacing, or cut before its closing tag",
                rf"<\s*{ttag}\s*>\s*(.+?)\s*(?:<\s*/\s*{ttag}\s*>|$)",
                "tool",
            )
        )
        if spec.tool[1] == "code":
            out.append(
                (
                    "code_fence",
                    "code in a ``` fence instead of the tool tag",
                    r"```(?:python|py)?[ \t]*\n(.+?)(?:```|$)",
                    "tool",
                )
            )
        else:
            name = re.escape(spec.tool[0])
            out.append(
                (
                    "tool_prefix",
                    f'"{spec.tool[0]}: ..." or "{spec.tool[0]}(...)" instead of the tag',
                    rf"\b{name}\s*(?::|\()\s*['\"]?([^\n'\")<]+)",
                    "tool",
                )
            )
    if spec.answer_tag:
        atag = re.escape(spec.answer_tag)
        out.append(
            (
                "answer_tag_loose",
                f"an <{spec.answer_tag}> tag with other case or spacing, "
                "or cut before its closing tag",
                rf"<\s*{atag}\s*>\s*(.+?)\s*(?:<\s*/\s*{atag}\s*>|$)",
                "answer",
            )
        )
    out.append(("boxed", "a \\boxed{...} answer", r"\\boxed\s*\{([^{}]+)\}", "answer"))
    out.append(
        (
            "answer_prefix",
            '"Answer: ..." / "the answer is ..." with no tag',
            r"(?:final\s+answer|answer)\s*(?:is\b|:)\s*([^\n<]+)",
            "answer",
        )
    )
    if ctx.domain == "math":
        out.append(("hash_answer", '"#### N" at the end', r"####\s*([^\n]+)", "answer"))
    return out


def _find_lenient(ctx: RuleContext) -> Finding | None:
    inv = ctx.stats.invalid_turns
    if not inv:
        return None
    hits: list[tuple[str, str, str, str, list[str]]] = []
    for name, desc, rx, kind in _parser_patterns(ctx):
        pat = re.compile(rx, re.IGNORECASE | re.DOTALL)
        ids = []
        for tid, resp, _finish in inv:
            if kind == "move_unique":
                found = {m.lower() for m in pat.findall(resp)}
                if len(found) == 1:
                    ids.append(tid)
            else:
                m = pat.search(resp)
                if m and m.group(1).strip():
                    ids.append(tid)
        if ids:
            hits.append((name, desc, rx, kind, ids))
    if not hits:
        return None
    hits.sort(key=lambda h: -len(h[4]))
    covered = {t for h in hits for t in h[4]}
    parts = [f"{len(h[4])} contain {h[1]}" for h in hits]
    ff = len(ctx.stats.format_failure_eps)
    ev = (
        f"{len(inv)} replies were unparseable under the parent's parser "
        f"({ff} episodes ended in format_failure); of those, " + "; ".join(parts) + "."
    )
    return Finding(
        count=len(covered),
        total=ctx.stats.episodes,
        cited=tuple(cite(t for h in hits for t in h[4])),
        evidence=ev,
        params={"patterns": [(h[0], h[2], h[3]) for h in hits]},
    )


_FAILED_HELPER = '''\
def _lenient_failed(result):
    """True when the parent's parser found nothing usable in the reply."""
    if result is None:
        return True
    if isinstance(result, dict):
        return result.get("type") == "invalid"
    return isinstance(result, str) and (not result.strip() or result.strip() == "__no_move__")
'''


def _build_lenient(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code = ensure_import(ctx.parent_code, "re")
    code, prev = wrap_function(code, "parse_action", "strict", ["response"])
    pats = f.params["patterns"]
    if ctx.domain == "chess":
        tagged = [rx for _n, rx, k in pats if k == "move"]
        bare = any(k == "move_unique" for _n, _rx, k in pats)
        body = (
            f"_LENIENT_MOVE_TAGS = {tuple(tagged)!r}\n"
            f"_LENIENT_BARE_UCI = {bare!r}\n"
            '_UCI_TOKEN = re.compile(r"\\b([a-h][1-8][a-h][1-8][qrbn]?)\\b", re.IGNORECASE)\n\n\n'
            + _FAILED_HELPER
            + "\n\n"
            "def parse_action(response, **context):\n"
            '    """The parent\'s parser first; then a tagged move in any case, or one bare UCI move."""\n'
            f"    result = {prev}\n"
            "    if not _lenient_failed(result):\n"
            "        return result\n"
            "    text = str(response)\n"
            "    for pattern in _LENIENT_MOVE_TAGS:\n"
            "        m = re.search(pattern, text, re.IGNORECASE | re.DOTALL)\n"
            "        if m:\n"
            "            return m.group(1).lower()\n"
            "    if _LENIENT_BARE_UCI:\n"
            "        moves = list(dict.fromkeys(m.lower() for m in _UCI_TOKEN.findall(text)))\n"
            "        if len(moves) == 1:\n"
            "            return moves[0]\n"
            "    return result\n"
        )
        accepted = ", ".join(n for n, _rx, _k in pats)
        change = (
            f"parse_action keeps the parent's parser and, when it finds no move, also accepts "
            f"{accepted} (a reply naming several different moves stays unparsed)."
        )
        return append_block(code, body), change
    tool = ctx.spec.tool or ("", "")
    body = (
        "_LENIENT_PATTERNS = (\n" + "".join(f"    ({k!r}, {rx!r}),\n" for _n, rx, k in pats) + ")\n"
        f"_LENIENT_TOOL = {tuple(tool)!r}\n\n\n" + _FAILED_HELPER + "\n\n"
        "def parse_action(response, **context):\n"
        '    """The parent\'s parser first; then the earliest reply form seen in failed turns."""\n'
        f"    result = {prev}\n"
        "    if not _lenient_failed(result):\n"
        "        return result\n"
        "    text = str(response)\n"
        "    best = None\n"
        "    for kind, pattern in _LENIENT_PATTERNS:\n"
        '        if kind == "tool" and not _LENIENT_TOOL[0]:\n'
        "            continue\n"
        "        m = re.search(pattern, text, re.IGNORECASE | re.DOTALL)\n"
        "        if m and m.group(1).strip() and (best is None or m.start() < best[0]):\n"
        "            best = (m.start(), kind, m.group(1).strip())\n"
        "    if best is None:\n"
        "        return result\n"
        "    _start, kind, value = best\n"
        '    if kind == "tool":\n'
        '        return {"type": "tool", "name": _LENIENT_TOOL[0],\n'
        '                "arguments": {_LENIENT_TOOL[1]: value}}\n'
        '    return {"type": "answer", "content": value}\n'
    )
    accepted = ", ".join(n for n, _rx, _k in pats)
    change = (
        "parse_action keeps the parent's parser and, only when it fails, reads the earliest of "
        f"these forms: {accepted}."
    )
    return append_block(code, body), change


def _find_arg_cleanup(ctx: RuleContext) -> Finding | None:
    bad = []
    for i, args in enumerate(ctx.stats.tool_error_args):
        for v in args.values():
            s = str(v)
            if (
                "```" in s
                or s.strip() != s
                or (s[:1] in "'\"`" and s[-1:] == s[:1])
                or not s.strip()
            ):
                bad.append(i)
                break
    if not bad:
        return None
    ids = cite(ctx.stats.tool_error_eps)
    ev = (
        f"{len(ctx.stats.tool_error_details)} tool calls failed; {len(bad)} of them passed "
        "arguments wrapped in code fences, quotes or stray whitespace "
        f"(e.g. {_short(str(ctx.stats.tool_error_args[bad[0]]))})."
    )
    return Finding(
        count=len(bad),
        total=max(1, len(ctx.stats.tool_error_details)),
        cited=tuple(ids),
        evidence=ev,
    )


def _build_arg_cleanup(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code = ensure_import(ctx.parent_code, "re")
    code, prev = wrap_function(code, "parse_action", "raw_args", ["response"])
    body = (
        "def _clean_argument(value):\n"
        '    """Strip code fences, wrapping quotes and stray whitespace from one argument."""\n'
        "    if not isinstance(value, str):\n"
        "        return value\n"
        "    text = value.strip()\n"
        '    fenced = re.match(r"^```[A-Za-z]*[ \\t]*\\n?(.*?)\\n?```$", text, re.DOTALL)\n'
        "    if fenced:\n"
        "        text = fenced.group(1).strip()\n"
        '    while len(text) >= 2 and text[0] == text[-1] and text[0] in "\'\\"`":\n'
        "        text = text[1:-1].strip()\n"
        "    return text\n\n\n"
        "def parse_action(response, **context):\n"
        '    """The parent\'s parser, then tool arguments cleaned before they reach the tool."""\n'
        f"    result = {prev}\n"
        '    if isinstance(result, dict) and result.get("type") == "tool":\n'
        '        args = result.get("arguments") or {}\n'
        "        if isinstance(args, dict):\n"
        "            result = dict(result)\n"
        '            result["arguments"] = {k: _clean_argument(v) for k, v in args.items()}\n'
        "    return result\n"
    )
    return append_block(code, body), (
        "parse_action now strips code fences, wrapping quotes and "
        "whitespace from tool arguments before the call."
    )


# ---------------------------------------------------------------------------- feedback


def _find_format_feedback(ctx: RuleContext) -> Finding | None:
    inv = ctx.stats.invalid_turns
    if not inv:
        return None
    ff = ctx.stats.format_failure_eps
    ev = (
        f"{len(inv)} replies were unparseable and {len(ff)} of {ctx.stats.episodes} episodes "
        "ended in format_failure: the model was told its reply was malformed but not what the "
        "right form looks like, and had few retries to fix it."
    )
    return Finding(
        count=max(len(ff), 1),
        total=ctx.stats.episodes,
        cited=tuple(cite(ff or [t for t, _r, _f in inv])),
        evidence=ev,
    )


def _build_format_feedback(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_feedback", "plain", ["kind", "detail"])
    budget = int(get_constant(ctx.parent_code, "FORMAT_RETRY_BUDGET", 1) or 1)
    new_budget = min(10, max(budget + 1, 2))
    body = (
        f"_FORMAT_EXAMPLE = {_q(ctx.spec.example())}\n\n\n"
        "def format_feedback(kind, detail, **context):\n"
        '    """After an unreadable reply, say exactly what a readable one looks like."""\n'
        f"    text = {prev}\n"
        '    if kind == "format":\n'
        '        lead = (str(text).strip() + " ") if str(text).strip() else ""\n'
        '        return lead + "Your last reply could not be read. " + _FORMAT_EXAMPLE\n'
        "    return text\n"
    )
    code = append_block(code, body)
    code = set_constant(code, "FORMAT_RETRY_BUDGET", new_budget)
    change = (
        f"format_feedback now follows a malformed reply with the exact expected form "
        f"({ctx.spec.example()!r}), and FORMAT_RETRY_BUDGET goes {budget} -> {new_budget} so "
        "the model can use that feedback."
    )
    return code, change


def _find_illegal_feedback(ctx: RuleContext) -> Finding | None:
    n = ctx.stats.illegal_turns
    if n <= 0:
        return None
    ev = (
        f"{n} illegal moves in {len(ctx.stats.illegal_eps)} episodes; "
        f"{ctx.stats.stop_reasons.get('illegal_moves', 0)} episodes ended because the illegal-move "
        "budget ran out."
    )
    return Finding(
        count=len(ctx.stats.illegal_eps),
        total=ctx.stats.episodes,
        cited=tuple(cite(ctx.stats.illegal_eps)),
        evidence=ev,
    )


def _build_illegal_feedback(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_feedback", "plain", ["kind", "detail"])
    budget = int(get_constant(ctx.parent_code, "ILLEGAL_MOVE_RETRY_BUDGET", 1) or 1)
    new_budget = min(10, max(budget + 1, 2))
    tag = ctx.spec.answer_tag or "move"
    hint = (
        f"That move is not legal in this position. Pick one move from the legal-move list and "
        f"copy its UCI code exactly as written in brackets, for example <{tag}>e2e4</{tag}>."
    )
    body = (
        f"_ILLEGAL_HINT = {_q(hint)}\n\n\n"
        "def format_feedback(kind, detail, **context):\n"
        '    """After an illegal move, point the model back to the legal-move list."""\n'
        f"    text = {prev}\n"
        '    if kind == "illegal":\n'
        '        lead = (str(text).strip() + " ") if str(text).strip() else ""\n'
        "        return lead + _ILLEGAL_HINT\n"
        "    return text\n"
    )
    code = append_block(code, body)
    code = set_constant(code, "ILLEGAL_MOVE_RETRY_BUDGET", new_budget)
    return code, (
        f"format_feedback now tells the model to copy a move from the legal-move list "
        f"after an illegal move; ILLEGAL_MOVE_RETRY_BUDGET goes {budget} -> {new_budget} "
        "so the hint can be used."
    )


def _find_tool_error_view(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.tool_error_eps
    if not eps or not ctx.spec.tool:
        return None
    details = [d for d in ctx.stats.tool_error_details if d.strip()]
    sample = _short(details[0].strip().splitlines()[-1]) if details else ""
    ev = (
        f"{len(ctx.stats.tool_error_details)} tool calls failed in {len(eps)} of "
        f"{ctx.stats.episodes} episodes"
        + (f"; e.g. {sample!r}" if sample else "")
        + "; the failure is shown as a raw record, with no hint how to recover."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_tool_error_view(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "raw", ["observation"])
    tool = ctx.spec.tool or ("tool", "input")
    tag = ctx.spec.tool_tag or tool[0]
    if tool[1] == "code":
        hint = (
            f"Fix the code and call the tool again; it must print its result, for example "
            f"<{tag}>print(12 * 7)</{tag}>."
        )
    else:
        hint = (
            f"Call the tool again with a short {tool[1]} of a few key words from the question, "
            f"for example {ctx.spec.tool_form}."
        )
    body = (
        f"_TOOL_ERROR_HINT = {_q(hint)}\n\n\n"
        "def format_observation(observation, **context):\n"
        '    """A failed tool call: the error\'s last line first, then how to call it right."""\n'
        '    if isinstance(observation, dict) and observation.get("error"):\n'
        '        lines = str(observation.get("error")).strip().splitlines() or [""]\n'
        '        out = str(observation.get("stdout") or "").strip()\n'
        '        text = "The tool call failed: " + lines[-1][:300]\n'
        "        if out:\n"
        '            text += "\\nOutput before the error:\\n" + out[:500]\n'
        '        return text + "\\n" + _TOOL_ERROR_HINT\n'
        f"    return {prev}\n"
    )
    return append_block(code, body), (
        "format_observation now shows a failed tool call as the "
        "error's last line plus a correct call form, instead of the "
        "raw record; successful results are shown as before."
    )


# ---------------------------------------------------------------------------- prompts


def _find_format_prompt(ctx: RuleContext) -> Finding | None:
    inv = ctx.stats.invalid_turns
    if not inv:
        return None
    eps = {t for t, _r, _f in inv}
    ev = (
        f"{len(inv)} replies in {len(eps)} of {ctx.stats.episodes} episodes did not follow the "
        "required form; the prompt never shows a complete example of it."
    )
    return Finding(
        count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(sorted(eps))), evidence=ev
    )


def _build_format_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    text = "Answer format. " + ctx.spec.example() + " Write nothing after the closing tag."
    return _add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT gains a format paragraph with a complete example: {text!r}"
    )


def _find_brevity(ctx: RuleContext) -> Finding | None:
    cut = ctx.stats.length_cut_turns
    if not cut:
        return None
    eps = set(cut)
    ev = (
        f"{len(cut)} generations in {len(eps)} of {ctx.stats.episodes} episodes hit the "
        "max_new_tokens cap before the reply was complete."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(cut)), evidence=ev)


def _build_brevity(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    text = (
        "Keep every reply short: at most two sentences of reasoning, then the tag. "
        + ctx.spec.example()
    )
    return _add_to_system_prompt(ctx.parent_code, text), (
        "SYSTEM_PROMPT now asks for short replies that end with the tag, so the tag is written "
        "before the token cap."
    )


def _find_tool_prompt(ctx: RuleContext) -> Finding | None:
    if not ctx.spec.tool:
        return None
    eps = ctx.stats.wrong_no_tool_eps if ctx.domain == "math" else ctx.stats.wrong_few_tools_eps
    if not eps:
        return None
    how = "without calling the tool" if ctx.domain == "math" else "after at most one search"
    ev = (
        f"{len(eps)} of {len(ctx.stats.wrong_eps)} wrong answers were given {how} "
        f"(success {ctx.stats.success_rate:.0%} over {ctx.stats.episodes} episodes)."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_tool_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    if ctx.domain == "math":
        text = (
            f"Work it out with the tool: write {ctx.spec.tool_form}, read the printed result, "
            f"then give the final answer as {ctx.spec.answer_form}."
        )
    else:
        text = (
            f"Look things up before answering: search with {ctx.spec.tool_form}. If the "
            "passages mention another entity that the question depends on, search for that "
            f"entity too. Answer with {ctx.spec.answer_form}, using a name or phrase copied "
            "from a passage."
        )
    return _add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT gains a short tool-use procedure: {text!r}"
    )


def _find_turn_prompt(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.turn_cap_eps
    if not eps:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes hit the turn cap without a final "
        "answer; the prompt never says how many turns there are."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_turn_prompt(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    turns = int(get_constant(ctx.parent_code, "MAX_TURNS", 4) or 4)
    text = (
        f"You have at most {turns} replies in total. Give your final answer "
        f"({ctx.spec.answer_form}) no later than reply {turns}; never end on a tool call."
    )
    return _add_to_system_prompt(ctx.parent_code, text), (
        f"SYSTEM_PROMPT now states the turn limit and when to answer: {text!r}"
    )


# ---------------------------------------------------------------------------- termination


def _find_turn_budget(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.turn_cap_eps
    if not eps:
        return None
    turns = int(get_constant(ctx.parent_code, "MAX_TURNS", 4) or 4)
    cap = _TURN_CAPS.get(ctx.domain, _DEFAULT_TURN_CAP)
    if turns >= cap:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes stopped at MAX_TURNS={turns} still "
        "working (turn_cap), so they scored 0 whatever they had found."
    )
    return Finding(
        count=len(eps),
        total=ctx.stats.episodes,
        cited=tuple(cite(eps)),
        evidence=ev,
        params={"turns": turns, "new": min(cap, max(turns + 2, turns * 2))},
    )


def _build_turn_budget(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "select_context", "all", ["messages"])
    final = (
        f"This is your last reply: give your final answer now as {ctx.spec.answer_form}."
        if ctx.domain != "chess"
        else ""
    )
    body = (
        f"_FINAL_TURN_NOTE = {_q(final)}\n\n\n"
        "def select_context(messages, **context):\n"
        '    """Tell the model which turn it is on, and to answer on the last one."""\n'
        f"    msgs = [dict(m) for m in {prev}]\n"
        '    turn, cap = context.get("turn_count"), context.get("max_turns")\n'
        "    if not isinstance(turn, int) or not isinstance(cap, int):\n"
        "        return msgs\n"
        '    note = f"(Reply {turn} of {cap}.)"\n'
        "    if turn >= cap and _FINAL_TURN_NOTE:\n"
        '        note = note + " " + _FINAL_TURN_NOTE\n'
        "    for m in reversed(msgs):\n"
        '        if m.get("role") == "user":\n'
        '            m["content"] = str(m.get("content", "")).rstrip() + "\\n\\n" + note\n'
        "            break\n"
        "    return msgs\n"
    )
    code = append_block(code, body)
    code = set_constant(code, "MAX_TURNS", f.params["new"])
    return code, (
        f"MAX_TURNS goes {f.params['turns']} -> {f.params['new']}, with a stop rule: "
        "select_context marks each user message with the turn number and, on the last "
        "turn, tells the model to answer now."
    )


# ---------------------------------------------------------------------------- tool I/O


def _find_more_evidence(ctx: RuleContext) -> Finding | None:
    st = ctx.stats
    asked = max(st.tool_topk) if st.tool_topk else None
    narrow = asked is not None and asked < 3
    # With a narrow topk, every failed episode is one that more passages could have helped.
    starved = [t for t in dict.fromkeys(st.wrong_eps + st.turn_cap_eps) if narrow]
    affected = list(dict.fromkeys(st.recall_wrong_eps + st.truncated_obs + starved))
    if not st.truncated_obs and not starved:
        return None
    lengths = sorted(st.passage_lengths) or [400]
    p90 = lengths[min(len(lengths) - 1, int(0.9 * len(lengths)))]
    chars = max(200, min(600, p90 + 20))
    per = max(st.passages_per_obs or [1])
    shown = min(5, max(per, 3))
    parts = []
    if st.truncated_obs:
        parts.append(
            f"{len(set(st.truncated_obs))} of {st.episodes} episodes saw cut evidence: of "
            f"{st.passages_seen} retrieved passages in {st.observations} tool results, "
            f"{st.passages_truncated} were cut short and {st.passages_hidden} were not shown at "
            f"all (longest passage {lengths[-1]} chars)"
        )
    if narrow:
        parts.append(
            f"the parser asks the tool for only topk={asked} passage(s) per search, and "
            f"{len(starved)} episodes ended wrong or on the turn cap"
        )
    if st.recall_wrong_eps:
        parts.append(
            f"in {len(st.recall_wrong_eps)} wrong episodes a retrieved passage did hold the answer"
        )
    return Finding(
        count=len(affected),
        total=st.episodes,
        cited=tuple(cite(affected)),
        evidence="; ".join(parts) + ".",
        params={"chars": chars, "passages": shown, "raise_topk": narrow},
    )


_PASSAGE_HELPER = '''\
def _passage_items(observation):
    """(title, text) pairs from a tool result: a string, a list, or a dict holding a list."""
    if isinstance(observation, str):
        return [("", observation)] if observation.strip() else []
    if isinstance(observation, dict):
        for key in ("passages", "results", "documents", "docs", "hits", "items", "contexts"):
            if isinstance(observation.get(key), list):
                return _passage_items(observation[key])
        for key in ("text", "content", "contents", "passage", "output", "stdout", "result"):
            if isinstance(observation.get(key), str):
                return _passage_items(observation[key])
        return []
    items = []
    if isinstance(observation, (list, tuple)):
        for item in observation:
            if isinstance(item, str) and item.strip():
                items.append(("", item))
            elif isinstance(item, dict):
                title = item.get("title") or ""
                text = ""
                for key in ("text", "content", "contents", "passage"):
                    if isinstance(item.get(key), str):
                        text = item[key]
                        break
                if text or title:
                    items.append((str(title), str(text)))
    return items
'''


def _build_more_evidence(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "short", ["observation"])
    body = (
        f"_PASSAGES_SHOWN = {f.params['passages']}\n"
        f"_PASSAGE_CHARS = {f.params['chars']}\n\n\n" + _PASSAGE_HELPER + "\n\n"
        "def format_observation(observation, **context):\n"
        '    """Tool results: several passages, numbered, each cut at a sentence-sized limit."""\n'
        "    items = _passage_items(observation) if observation is not None else []\n"
        "    if not items:\n"
        f"        return {prev}\n"
        "    if len(items) == 1 and not items[0][0]:\n"
        "        text, limit = str(items[0][1]).strip(), _PASSAGE_CHARS * _PASSAGES_SHOWN\n"
        '        return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."\n'
        "    lines = []\n"
        "    for i, (title, text) in enumerate(items[:_PASSAGES_SHOWN], 1):\n"
        '        text = " ".join(str(text).split())\n'
        "        if len(text) > _PASSAGE_CHARS:\n"
        '            text = text[:_PASSAGE_CHARS].rsplit(" ", 1)[0] + " ..."\n'
        '        lines.append(f"[{i}] {title}: {text}" if title else f"[{i}] {text}")\n'
        '    return "\\n".join(lines)\n'
    )
    code = append_block(code, body)
    change = (
        f"format_observation now shows up to {f.params['passages']} passages, numbered with "
        f"their titles, each up to {f.params['chars']} characters, instead of the parent's "
        "cut view"
    )
    if f.params.get("raise_topk"):
        code, pprev = wrap_function(code, "parse_action", "narrow", ["response"])
        code = append_block(
            code,
            (
                "def parse_action(response, **context):\n"
                '    """The parent\'s parser; a search asks for as many passages as are shown."""\n'
                f"    result = {pprev}\n"
                '    if isinstance(result, dict) and result.get("type") == "tool":\n'
                '        args = result.get("arguments")\n'
                '        if isinstance(args, dict) and isinstance(args.get("topk"), int) \\\n'
                '                and args["topk"] < _PASSAGES_SHOWN:\n'
                "            result = dict(result, arguments=dict(args, topk=_PASSAGES_SHOWN))\n"
                "    return result\n"
            ),
        )
        change += (
            f"; the search call asks for {f.params['passages']} passages instead of the "
            "parent's fixed smaller topk, so there is something more to show"
        )
    return code, change + "."


def _find_search_again(ctx: RuleContext) -> Finding | None:
    if ctx.domain != "search" or not ctx.spec.tool:
        return None
    eps = ctx.stats.wrong_few_tools_eps
    if not eps:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes answered wrongly after at most one "
        f"search (mean {ctx.stats.tool_calls_total / max(1, ctx.stats.episodes):.1f} tool calls "
        "per episode); two-hop questions need a second lookup."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_search_again(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "format_observation", "bare", ["observation"])
    hint = (
        f"If these passages do not state the answer, search again for the entity they "
        f"point to with {ctx.spec.tool_form}; otherwise answer with {ctx.spec.answer_form}."
    )
    body = (
        f"_SEARCH_AGAIN_HINT = {_q(hint)}\n\n\n"
        "def format_observation(observation, **context):\n"
        '    """After a tool result, remind the model that a second lookup is allowed."""\n'
        f"    text = {prev}\n"
        '    turn, cap = context.get("turn_count"), context.get("max_turns")\n'
        "    if observation is None or not str(text).strip() or turn == 1:\n"
        "        return text\n"
        "    if isinstance(turn, int) and isinstance(cap, int) and turn >= cap:\n"
        "        return text\n"
        '    return str(text).rstrip() + "\\n\\n" + _SEARCH_AGAIN_HINT\n'
    )
    return append_block(code, body), (
        "format_observation appends, after each search result, a rule to search again for the "
        "bridging entity when the passages do not state the answer (not on the last turn)."
    )


def _find_annotate_moves(ctx: RuleContext) -> Finding | None:
    if ctx.domain != "chess" or not _LEGAL_LINE.search(ctx.shown_text):
        return None
    st = ctx.stats
    eps = list(dict.fromkeys(st.wrong_eps + st.illegal_eps))
    if not eps:
        return None
    ev = (
        f"{len(st.wrong_eps)} episodes ended on a legal but wrong move and "
        f"{len(st.illegal_eps)} had illegal moves, out of {st.episodes}; the legal-move list "
        "shows plain SAN, so checks, captures and promotions are easy to miss."
    )
    return Finding(count=len(eps), total=st.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_annotate_moves(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code = ensure_import(ctx.parent_code, "re")
    code, prev = wrap_function(code, "format_observation", "plain", ["observation"])
    body = (
        '_LEGAL_MOVE_LINE = re.compile(r"^(\\s*-\\s*\\[([a-h][1-8][a-h][1-8][qrbn]?)\\]\\s*'
        'SAN=(\\S+))\\s*$")\n\n\n'
        "def format_observation(observation, **context):\n"
        '    """Tag each legal move with check / mate / capture / promotion and list those first."""\n'
        f"    text = str({prev})\n"
        "    out, forcing = [], []\n"
        "    for line in text.splitlines():\n"
        "        m = _LEGAL_MOVE_LINE.match(line)\n"
        "        if m:\n"
        "            san, tags = m.group(3), []\n"
        '            if "#" in san:\n'
        '                tags.append("mate")\n'
        '            elif "+" in san:\n'
        '                tags.append("check")\n'
        '            if "x" in san:\n'
        '                tags.append("capture")\n'
        '            if "=" in san:\n'
        '                tags.append("promotion")\n'
        "            if tags:\n"
        '                line = m.group(1) + "  (" + ", ".join(tags) + ")"\n'
        '                forcing.append(m.group(2) + " " + "/".join(tags))\n'
        "        out.append(line)\n"
        "    if forcing:\n"
        '        out.append("Forcing moves (checks, captures, promotions): " + ", ".join(forcing))\n'
        '    return "\\n".join(out)\n'
    )
    return append_block(code, body), (
        "format_observation keeps the parent's board view and tags every legal move that gives "
        "check or mate, captures or promotes, with a summary line of those forcing moves. It "
        "never picks a move."
    )


# ---------------------------------------------------------------------------- context


def _find_context_window(ctx: RuleContext) -> Finding | None:
    eps = ctx.stats.context_cap_eps
    if not eps:
        return None
    ev = (
        f"{len(eps)} of {ctx.stats.episodes} episodes ended because the prompt no longer fit "
        "the model's context (token_cap), after "
        f"{ctx.stats.mean_turns:.1f} turns on average."
    )
    return Finding(count=len(eps), total=ctx.stats.episodes, cited=tuple(cite(eps)), evidence=ev)


def _build_context_window(ctx: RuleContext, f: Finding) -> tuple[str, str]:
    code, prev = wrap_function(ctx.parent_code, "select_context", "full", ["messages"])
    body = (
        "_KEEP_RECENT = 4\n\n\n"
        "def select_context(messages, **context):\n"
        '    """System and first user message, then only the most recent exchanges."""\n'
        f"    msgs = list({prev})\n"
        '    head = msgs[:1] if msgs and msgs[0].get("role") == "user" else msgs[:2]\n'
        "    rest = msgs[len(head):]\n"
        "    if len(rest) <= _KEEP_RECENT:\n"
        "        return msgs\n"
        "    dropped = len(rest) - _KEEP_RECENT\n"
        '    note = {"role": "user", "content": f"({dropped} earlier messages omitted.)"}\n'
        "    tail = rest[-_KEEP_RECENT:]\n"
        '    if tail and tail[0].get("role") == "user":\n'
        '        tail = [dict(tail[0], content=note["content"] + "\\n" + str(tail[0].get("content", "")))]'
        " + tail[1:]\n"
        "        return head + tail\n"
        "    return head + [note] + tail\n"
    )
    return append_block(code, body), (
        "select_context keeps the system message, the task, and the last 4 messages, with a note "
        "saying how many were dropped, so long episodes stay inside the context."
    )


# ---------------------------------------------------------------------------- catalog

CATALOG: tuple[Mechanism, ...] = (
    Mechanism(
        "lenient_parser",
        "parser",
        "Parse the reply forms the model actually uses",
        (),
        _find_lenient,
        _build_lenient,
        "fewer format failures, so more episodes reach an answer",
    ),
    Mechanism(
        "more_evidence",
        "tool_io",
        "Show more and longer retrieved passages",
        ("search",),
        _find_more_evidence,
        _build_more_evidence,
        "answers that were cut from the passages become visible, raising success",
    ),
    Mechanism(
        "turn_budget_stop_rule",
        "termination",
        "More turns, with a final-turn stop rule",
        (),
        _find_turn_budget,
        _build_turn_budget,
        "episodes that ran out of turns finish with an answer",
    ),
    Mechanism(
        "annotate_legal_moves",
        "tool_io",
        "Annotate legal moves with checks and captures",
        ("chess",),
        _find_annotate_moves,
        _build_annotate_moves,
        "forcing moves stand out, so fewer wrong and illegal moves",
    ),
    Mechanism(
        "illegal_move_feedback",
        "feedback",
        "Point illegal moves back to the legal list",
        ("chess",),
        _find_illegal_feedback,
        _build_illegal_feedback,
        "illegal moves get corrected instead of ending the episode",
    ),
    Mechanism(
        "format_feedback_example",
        "feedback",
        "Feedback that shows the expected format",
        (),
        _find_format_feedback,
        _build_format_feedback,
        "malformed replies get corrected on the retry instead of ending the episode",
    ),
    Mechanism(
        "search_again_rule",
        "tool_io",
        "Prompt a second search when passages fall short",
        ("search",),
        _find_search_again,
        _build_search_again,
        "two-hop questions get their second lookup before the answer",
    ),
    Mechanism(
        "tool_error_view",
        "tool_io",
        "Readable tool errors with a correct call form",
        ("search", "math"),
        _find_tool_error_view,
        _build_tool_error_view,
        "failed tool calls get fixed on the next turn",
    ),
    Mechanism(
        "tool_argument_cleanup",
        "parser",
        "Clean tool arguments before the call",
        ("search", "math"),
        _find_arg_cleanup,
        _build_arg_cleanup,
        "fewer tool errors from fenced or quoted arguments",
    ),
    Mechanism(
        "recent_context_window",
        "context",
        "Keep only recent messages in long episodes",
        (),
        _find_context_window,
        _build_context_window,
        "long episodes no longer end on the context limit",
    ),
    Mechanism(
        "format_prompt_example",
        "prompts",
        "State the reply format with an example",
        (),
        _find_format_prompt,
        _build_format_prompt,
        "fewer unparseable replies",
    ),
    Mechanism(
        "tool_use_prompt",
        "prompts",
        "A tool-use procedure in the system prompt",
        ("search", "math"),
        _find_tool_prompt,
        _build_tool_prompt,
        "more answers grounded in tool results",
    ),
    Mechanism(
        "turn_limit_prompt",
        "prompts",
        "State the turn limit in the prompt",
        (),
        _find_turn_prompt,
        _build_turn_prompt,
        "fewer episodes ending on the turn cap",
    ),
    Mechanism(
        "brevity_prompt",
        "prompts",
        "Ask for short replies that end with the tag",
        (),
        _find_brevity,
        _build_brevity,
        "fewer replies cut by the token cap",
    ),
)
MECHANISMS = {m.name: m for m in CATALOG}

_SURFACE_WORDS = {
    "parser": "parser",
    "parse": "parser",
    "prompt": "prompts",
    "feedback": "feedback",
    "observation": "tool_io",
    "passage": "tool_io",
    "tool": "tool_io",
    "context": "context",
    "turn": "termination",
    "termination": "termination",
}
_AVOID = re.compile(
    r"\b(?:no|avoid|not|never|stop|don't|do not)\b[^.;]{0,30}?\b("
    + "|".join(_SURFACE_WORDS)
    + r")",
    re.IGNORECASE,
)


def _short(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------------------- proposer


@dataclass
class _History:
    excluded: dict[str, str] = field(default_factory=dict)  # mechanism -> why
    helped: dict[str, str] = field(default_factory=dict)  # mechanism -> where it helped
    avoid_surfaces: dict[str, str] = field(default_factory=dict)  # surface -> reviewer reason
    notes: list[str] = field(default_factory=list)


def _history(archive: PhaseArchive, parent_id: str) -> _History:
    h = _History()
    lineage = set(archive.lineage(parent_id))
    for rec in archive.records():
        reason = rec.decision.get("reason", "") or rec.status_reason
        if rec.status == "rejected":
            for m in _AVOID.finditer(reason or ""):
                h.avoid_surfaces[_SURFACE_WORDS[m.group(1).lower()]] = reason
            if reason:
                h.notes.append(
                    f"{rec.id} ({rec.mechanism or rec.surface}) was rejected: {_short(reason)}"
                )
        if not rec.mechanism:
            continue
        if rec.id in lineage:
            h.excluded[rec.mechanism] = f"already in the parent's lineage ({rec.id})"
        elif rec.status in ("rejected", "invalid", "crashed"):
            h.excluded[rec.mechanism] = f"{rec.id} was {rec.status}: {_short(reason)}"
        elif rec.status in SCORED_STATUSES:
            parent = archive.record(rec.parent_id) if rec.parent_id else None
            base = parent.success_rate if parent else None
            mine = rec.success_rate
            if base is not None and mine is not None and mine < base:
                h.excluded[rec.mechanism] = f"{rec.id} scored {mine:.0%} vs its parent's {base:.0%}"
                h.notes.append(f"{rec.id} ({rec.mechanism}) scored worse than {rec.parent_id}.")
            elif rec.parent_id == parent_id:
                h.excluded[rec.mechanism] = f"already tried on {parent_id} ({rec.id})"
            elif base is not None and mine is not None and mine > base:
                h.helped[rec.mechanism] = (
                    f"on {rec.parent_id} it raised success {base:.0%} -> {mine:.0%} ({rec.id})"
                )
        else:
            h.excluded[rec.mechanism] = f"{rec.id} is still {rec.status}"
    return h


def _evidence_source(archive: PhaseArchive, parent_id: str) -> str:
    """The nearest candidate in the lineage with traces (a parent may be pinned unscored)."""
    for cid in archive.lineage(parent_id):
        if (archive.folder(cid) / "traces.jsonl").exists():
            return cid
    return parent_id


def _shown_sample(traces: list[dict[str, Any]], n: int = 20) -> str:
    parts = []
    for tr in traces[:n]:
        for turn in (tr.get("turns") or [])[:1]:
            for m in turn.get("prompt") or []:
                parts.append(str(m.get("content", "")))
    return "\n".join(parts)


class RulesProposer:
    """Deterministic, offline, evidence-driven: one mechanism per candidate."""

    name = "rules"

    def __init__(self, catalog: tuple[Mechanism, ...] = CATALOG) -> None:
        self.catalog = catalog

    def rank(
        self, request: ProposalRequest, parent_id: str | None = None
    ) -> tuple[list[tuple[Mechanism, Finding]], RuleContext, _History]:
        """Untried mechanisms with evidence in `parent_id`'s traces, strongest first."""
        archive = request.archive
        parent_id = parent_id or request.default_parent or (archive.best() or "")
        if not parent_id:
            raise ValueError("the archive has no candidate to build on")
        source = _evidence_source(archive, parent_id)
        traces = list(archive.traces(source))
        stats = failure_stats(source, traces)
        code = archive.code(parent_id)
        ctx = RuleContext(
            request.domain,
            parent_id,
            code,
            stats,
            format_spec(request.domain, code, stats),
            _shown_sample(traces),
        )
        hist = _history(archive, parent_id)
        ranked: list[tuple[float, int, Mechanism, Finding]] = []
        for i, mech in enumerate(self.catalog):
            if not mech.applies_to(request.domain) or mech.name in hist.excluded:
                continue
            if request.prompt_only and mech.surface != "prompts":
                continue
            if mech.surface in hist.avoid_surfaces:
                continue
            finding = mech.find(ctx)
            if finding is None or finding.count <= 0:
                continue
            score = finding.count / max(1, finding.total) + (0.5 if mech.name in hist.helped else 0)
            ranked.append((score, i, mech, finding))
        ranked.sort(key=lambda r: (-r[0], r[1]))
        return [(m, f) for _s, _i, m, f in ranked], ctx, hist

    @staticmethod
    def parents(request: ProposalRequest) -> list[str]:
        """The best candidate first, then the other scored ones (by success, then fewer turns).

        When the best has no untried mechanism left, building on a runner-up stacks a second
        mechanism on one that held its ground, instead of wasting the iteration.
        """
        archive = request.archive
        first = request.default_parent or archive.best() or ""
        scored = [
            r
            for r in archive.records()
            if r.status in SCORED_STATUSES and r.success_rate is not None and r.id != first
        ]
        scored.sort(key=lambda r: (-(r.success_rate or 0.0), r.mean_turns or 0.0, int(r.id[1:])))
        return ([first] if first else []) + [r.id for r in scored]

    def propose(self, request: ProposalRequest) -> ProposalSession:
        t0 = time.monotonic()
        out: list[ProposedCandidate] = []
        problems: list[str] = []
        chosen: set[str] = set()
        parents = self.parents(request)
        if not parents:
            return ProposalSession(
                error="rules proposer: the archive has no candidate to build on",
                usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
            )
        for parent_id in parents:
            if len(out) >= request.n:
                break
            try:
                ranked, ctx, hist = self.rank(request, parent_id)
            except (ValueError, SyntaxError) as exc:
                problems.append(f"{parent_id}: {exc}")
                continue
            for mech, finding in ranked:
                if len(out) >= request.n:
                    break
                if mech.name in chosen:
                    continue
                try:
                    code, change = mech.build(ctx, finding)
                    check_syntax(code)
                except (ValueError, SyntaxError) as exc:
                    problems.append(f"{mech.name} on {parent_id}: {exc}")
                    continue
                if code == ctx.parent_code:
                    continue
                chosen.add(mech.name)
                out.append(
                    ProposedCandidate(
                        code=code,
                        hypothesis=self._hypothesis(mech, finding, ctx, hist, change),
                        parent_id=ctx.parent_id,
                        surface=mech.surface,
                        mechanism=mech.name,
                        cited_traces=finding.cited,
                    )
                )
        note = ""
        if len(out) < request.n:
            note = (
                f"rules proposer found evidence for {len(out)} untried mechanism(s) on "
                f"{', '.join(parents)}; asked for {request.n}"
            )
            if problems:
                note += "; " + "; ".join(problems)
        return ProposalSession(
            candidates=tuple(out),
            note=note,
            usage=ProposerUsageRecord(seconds=time.monotonic() - t0),
        )

    @staticmethod
    def _hypothesis(
        mech: Mechanism, f: Finding, ctx: RuleContext, hist: _History, change: str
    ) -> str:
        st = ctx.stats
        lines = [
            f"{mech.title}.",
            "",
            f"Surface: {mech.surface}. Mechanism: {mech.name}. Parent: {ctx.parent_id}.",
            "",
            f"Evidence ({st.candidate_id}: {st.episodes} harness episodes, success "
            f"{st.success_rate:.0%}, mean {st.mean_turns:.1f} turns): {f.evidence}",
            f"Affected: {_pct(f.count, f.total)}. Cited traces: {', '.join(f.cited) or '-'}.",
            "",
            f"Change: {change}",
            "",
            f"Expected: {mech.expected}.",
        ]
        if mech.name in hist.helped:
            lines.append(f"Earlier in this phase {hist.helped[mech.name]}.")
        if hist.notes:
            lines += ["", "Read from the archive: " + " ".join(hist.notes[-4:])]
        return "\n".join(lines)
