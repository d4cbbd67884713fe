"""A stronger math harness, used to measure how much the harness alone can add (calibration).

Against h0 it states the tool in a system prompt, shows the tool result as a plain `Output:` block
(with the error when there is one), allows four turns (so a failed program can be fixed) and two
format retries. It cannot make the model write the right program: on this domain that is the
weights' job.
"""

from __future__ import annotations

import re

SYSTEM_PROMPT = (
    "You solve math word problems. You can run Python: write <python> code </python> and you "
    "will see what it prints. Give the final answer as \\boxed{number}."
)
USER_PROMPT = "{question}\nPut your final answer in \\boxed{{}}."
MAX_TURNS = 4
FORMAT_RETRY_BUDGET = 2


def format_observation(observation: object, **context: object) -> str:
    if not isinstance(observation, dict):
        return str(observation or "")
    text = "Output:\n" + str(observation.get("stdout", "")).strip()
    if observation.get("error"):
        text += "\nError:\n" + str(observation["error"])
    return text


def _last_boxed(text: str) -> str | None:
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
