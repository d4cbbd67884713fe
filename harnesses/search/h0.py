"""Base search harness h0: deliberately weak, as in the paper.

It asks for <search>query</search> or <answer>...</answer>, forwards the query with topk 1, shows
only that one passage, cut at about 200 tokens as the paper's h0 cuts it (150 words: the built-in
encyclopedia's passages, 6 to 20 words, show whole), and allows two turns, so a two-hop question
cannot be finished. Its weaknesses are the paper's: one passage, two turns, no system prompt.
"""

from __future__ import annotations

import re

USER_PROMPT = (
    "Answer the question. To search, write <search>your query</search>. "
    "When you know the answer, write <answer>the answer</answer>.\n"
    "Question: {question}"
)
MAX_TURNS = 2
SHOWN_WORDS = 150  # about 200 tokens of English prose


def format_observation(observation: object, **context: object) -> str:
    if not isinstance(observation, dict):
        return ""
    passages = observation.get("passages") or []
    if not passages:
        return "<information>No results.</information>"
    first = passages[0]
    words = str(first.get("text", "")).split()
    text = " ".join(words[:SHOWN_WORDS])
    if len(words) > SHOWN_WORDS:
        text += " ..."
    return f"<information>{first.get('title', '')}: {text}</information>"


def parse_action(response: str) -> dict | None:
    answer = re.search(r"<answer>(.*?)</answer>", response, re.S)
    if answer and answer.group(1).strip():
        return {"type": "answer", "content": answer.group(1).strip()}
    query = re.search(r"<search>(.*?)</search>", response, re.S)
    if query and query.group(1).strip():
        return {
            "type": "tool",
            "name": "search",
            "arguments": {"query": query.group(1).strip(), "topk": 1},
        }
    return None
