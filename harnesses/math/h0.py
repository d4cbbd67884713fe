"""Base math harness h0: deliberately weak, as in the paper.

No system prompt, the bare question plus a request for a boxed answer, two turns. A reply with
\\boxed{...} is a final answer; a <python>...</python> or ```python``` block is a tool call.
"""

from __future__ import annotations

import re

USER_PROMPT = "{question}\nPut your final answer in \\boxed{{}}."
MAX_TURNS = 2


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced, or None."""
    found = None
    for match in re.finditer(r"\\boxed\s*\{", text):
        depth, i = 1, match.end()
        while i < len(text) and depth:
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
            i += 1
        if depth == 0:
            found = text[match.end() : i - 1].strip()
    return found


def parse_action(response: str) -> dict | None:
    boxed = _last_boxed(response)
    if boxed:
        return {"type": "answer", "content": boxed}
    block = re.search(r"<python>(.*?)</python>", response, re.S) or re.search(
        r"```python\s*\n(.*?)```", response, re.S
    )
    if block and block.group(1).strip():
        return {"type": "tool", "name": "python", "arguments": {"code": block.group(1)}}
    return None
