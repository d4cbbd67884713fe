"""Parser rules: read the reply forms the model actually wrote, and clean tool arguments.

Both wrap the parent's `parse_action`, so everything it already parses is parsed the same way.
A cleaned tool call helps only if its result is read on a later turn, so the cleanup rule is not
proposed on a parent with a single turn; the lenient parser acts on the reply it reads, whatever
the limits.
"""

from __future__ import annotations

import re

from whale_lab.search.codeedit import append_block, ensure_import, wrap_function
from whale_lab.search.proposers.rules.common import (
    Finding,
    Mechanism,
    RuleContext,
    short,
    too_few_turns,
)
from whale_lab.search.trace_stats import cite

_READ_RESULT_TURNS = 2  # the cleaned call, then a turn that reads its result


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
    if too_few_turns(ctx, _READ_RESULT_TURNS):
        return None
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
        f"(e.g. {short(str(ctx.stats.tool_error_args[bad[0]]))})."
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


LENIENT_PARSER = Mechanism(
    "lenient_parser",
    "parser",
    "Parse the reply forms the model actually uses",
    (),
    _find_lenient,
    _build_lenient,
    "fewer format failures, so more episodes reach an answer",
)


TOOL_ARGUMENT_CLEANUP = Mechanism(
    "tool_argument_cleanup",
    "parser",
    "Clean tool arguments before the call",
    ("search", "math"),
    _find_arg_cleanup,
    _build_arg_cleanup,
    "fewer tool errors from fenced or quoted arguments",
)
