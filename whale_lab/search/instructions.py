"""What every proposer is told: the rules that worked in Meta-Harness, the contract, the archive.

One text serves the LLM proposer (system message), the `claude` CLI (skill file) and humans
(`whale-lab search` prints the rules in manual mode), so all proposers play by the same rules.
"""

from __future__ import annotations

RULES = """\
Rules (these are what worked; candidates that break them are rejected):
1. One mechanism per candidate. Change one surface for one reason, so its score says whether the
   idea works. Do not bundle a prompt rewrite with a parser change.
2. No constants-only tweaks. Raising MAX_TURNS or a retry budget alone is not a mechanism; pair it
   with the behaviour that makes the extra turns useful (a stop rule, clearer feedback, ...).
3. No task-specific branches, dataset names, task ids or memorised answers. The harness must work
   for any task of the domain; the test split is never visible and is what counts in the end.
4. Ground each idea in traces. Read raw traces (`candidates/<id>/traces.jsonl`), count the failure
   you target, and cite trace ids (`<candidate>/<task>#<sample>`) in the hypothesis.
5. Read what was tried: `summary.md`, earlier hypotheses and the reviewers' rejection reasons in
   `decision.json`. Do not propose again what was rejected or scored worse, unless you fix the
   reason it failed.
"""

CONTRACT = """\
A harness is one Python file. Every surface has a default, so change only what you mean to:
- prompts: SYSTEM_PROMPT (str, "" = no system message), USER_PROMPT (str.format_map over the task's
  fields plus {observation}; unknown placeholders are left as written).
- tool I/O: format_observation(observation, **context) -> str, how a tool result or board is shown.
- parser: parse_action(response, **context) -> a dict {"type": "answer", "content": ...},
  {"type": "tool", "name": ..., "arguments": {...}}, {"type": "move", "move": "e2e4"},
  {"type": "invalid", "reason": ...}, a plain string (a final answer or a UCI move) or None.
- feedback: format_feedback(kind, detail, **context) -> str after invalid ("format"), illegal or
  tool_error output; FORMAT_RETRY_BUDGET and ILLEGAL_MOVE_RETRY_BUDGET (ints).
- context: select_context(messages, **context) -> the messages the model sees this turn.
- termination: MAX_TURNS (int) and any stop rule; STOP_SEQUENCES (tuple of str).
context holds turn_count (1-based), max_turns and the domain's extras (chess: side_to_move,
last_opponent_move). Functions receive only the keyword arguments their signature accepts.
Allowed imports: __future__, collections, dataclasses, functools, itertools, json, math, random,
re, statistics, string, textwrap, typing. No file, network or process access. In chess the harness
may present the board and legal moves any way it likes and parse the reply, but it must never choose
or search for a move itself (propose_action must return "").
"""

PROMPT_ONLY = """\
Prompt-only mode is ON: only the text of SYSTEM_PROMPT and USER_PROMPT may differ from the parent.
Any other change (code, constants, functions, imports) makes the candidate invalid.
"""

ARCHIVE_LAYOUT = """\
The archive (your whole filesystem): `summary.md` / `summary.json` (one row per candidate),
`frontier.json`, and `candidates/<id>/` with harness.py, meta.json, diff.patch, hypothesis.md,
validation.json, smoke.json, scores.json, traces.jsonl, status.json and decision.json.
"""


def proposer_instructions(
    domain: str,
    n: int,
    *,
    prompt_only: bool = False,
    tools: bool = True,
    steer: tuple[str, ...] = (),
) -> str:
    """The full instruction text for one proposer session."""
    parts = [
        f"You improve the harness of an LLM agent for the `{domain}` domain. The model weights are "
        f"fixed during this phase; only the harness changes. Write {n} new candidate harness "
        "files, each a complete file derived from a parent in the archive, each with a "
        "hypothesis that names the surface it changes and the evidence behind it.",
        RULES,
        CONTRACT,
        ARCHIVE_LAYOUT,
    ]
    if prompt_only:
        parts.append(PROMPT_ONLY)
    if steer:
        parts.append(steer_section(steer))
    if tools:
        parts.append(
            "Tools: list_files(path), read_file(path, offset, limit), grep(pattern, path), and "
            "write_candidate(code, hypothesis, parent, surface, cited_traces). Paths are relative "
            "to the archive root. Start with summary.md, then read the best candidate's code and "
            "a sample of its failed traces. Stop calling tools once you have written "
            f"{n} candidates."
        )
    return "\n\n".join(parts)


def steer_section(notes: tuple[str, ...]) -> str:
    """The reviewers' requests for one session, as the proposer reads them."""
    lines = "\n".join(f"- {n}" for n in notes)
    return (
        "Requests from the human reviewer for this session (follow them where they do not break "
        "the rules above; say in each hypothesis whether and how it follows them):\n" + lines
    )


def skill_text(domain: str, n: int, *, prompt_only: bool = False) -> str:
    """The skill file handed to the `claude` CLI: the same rules, plus where to put the output."""
    header = (
        "---\nname: harness-proposer\ndescription: Propose new candidate harnesses for a "
        "WHALE harness phase from the archive in ./archive\n---\n\n"
    )
    body = proposer_instructions(domain, n, prompt_only=prompt_only, tools=False)
    out = (
        "Output: for each candidate create `proposals/<name>/harness.py`, "
        "`proposals/<name>/hypothesis.md` and `proposals/<name>/meta.json` holding "
        '{"parent": "<candidate id>", "surface": "<surface>", "cited_traces": [...]}. '
        "Read only under ./archive; write only under ./proposals."
    )
    return header + body + "\n\n" + out + "\n"
