"""A stronger search harness, used to measure how much the harness alone can add (calibration).

Against h0 it changes the surfaces that decide what the model can read: three passages instead of
one, each shown whole, four turns instead of two (a two-hop question
needs two searches and an answer), and a system prompt that states the format and asks for an
answer copied from the passages.
"""

from __future__ import annotations

import re

SYSTEM_PROMPT = (
    "You answer questions about a fictional world. You know nothing about it, so search first: "
    "write <search>query</search>. Give the final answer as <answer>answer</answer>, copied from "
    "the passages."
)
USER_PROMPT = (
    "Answer the question. To search, write <search>your query</search>. "
    "When you know the answer, write <answer>the answer</answer>.\n"
    "Question: {question}"
)
MAX_TURNS = 4
FORMAT_RETRY_BUDGET = 1
TOPK = 3


def format_observation(observation: object, **context: object) -> str:
    if not isinstance(observation, dict):
        return ""
    passages = observation.get("passages") or []
    if not passages:
        return "<information>No results.</information>"
    lines = [f"{p.get('title', '')}: {' '.join(str(p.get('text', '')).split())}" for p in passages]
    return "<information>" + "\n".join(lines) + "</information>"


def parse_action(response: str) -> dict | None:
    answer = re.search(r"<answer>(.*?)</answer>", response, re.S)
    if answer and answer.group(1).strip():
        return {"type": "answer", "content": answer.group(1).strip()}
    query = re.search(r"<search>(.*?)</search>", response, re.S)
    if query and query.group(1).strip():
        return {
            "type": "tool",
            "name": "search",
            "arguments": {"query": query.group(1).strip(), "topk": TOPK},
        }
    return None
