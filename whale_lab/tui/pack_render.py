"""Rich text for the review pack: the paired summary, the pair table, files read, transcripts.

A transcript can hold two million characters; the screen shows each text cut to
`SHOWN_CHARS` and at most `SHOWN_ENTRIES` entries, and says what it left out (the file in the
archive keeps everything that was recorded).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from whale_lab.tui.review_pack import PairedTask, ReviewPack

SHOWN_CHARS = 1_500
SHOWN_ENTRIES = 400
PAIR_COLUMNS = ("task", "incoming", "candidate", "change")
CHANGE_STYLE = {"fixes": "bold green", "breaks": "bold red", "same": "dim"}


def _pct(v: Any) -> str:
    return f"{100 * float(v):.0f}%" if isinstance(v, (int, float)) else "—"


def _points(v: Any) -> str:
    return f"{100 * float(v):+.1f}" if isinstance(v, (int, float)) else "?"


def pack_text(pack: ReviewPack, *, transcript_key: str = "t", shown_floor: str = "") -> Text:
    """The pack's summary lines, above the pair table; the noise floor only when it says more
    than `shown_floor` (the line the review request carried, shown above it)."""
    t = Text()
    if pack.problem:
        t.append(pack.problem + "\n", style="dim")
        return t
    t.append("against ", style="dim")
    t.append(pack.incoming_id or "?", style="bold")
    if not pack.source:
        t.append("  not run yet: no smoke or scored episodes to pair\n", style="dim")
    elif not pack.pairs:
        t.append(f"  no task in common with the incoming harness ({pack.source} run)\n")
    else:
        where = "scored on the harness split" if pack.source == "scored" else "smoke run only"
        t.append(f"  {len(pack.pairs)} paired tasks ({where}): ")
        t.append(f"fixes {len(pack.fixes)}", style=CHANGE_STYLE["fixes"])
        t.append(" · ")
        t.append(f"breaks {len(pack.breaks)}", style=CHANGE_STYLE["breaks"])
        t.append(f" · same {len(pack.pairs) - len(pack.changed)}\n")
        p = pack.paired
        if p:
            low, high = p.get("low"), p.get("high")
            interval = f"[{_points(low)}, {_points(high)}]" if low is not None else "[too few]"
            t.append("paired difference ", style="dim")
            t.append(f"{_points(p.get('diff'))} points {interval} ")
            t.append(f"(95% bootstrap over {p.get('n_tasks', 0)} tasks)\n", style="dim")
    floor = pack.noise_floor
    if not floor.get("note"):
        t.append("noise floor ", style="dim")
        t.append("not measured (acceptance is not paired, or the phase has not got there)\n")
    elif str(floor["note"]) != shown_floor:
        t.append("noise floor ", style="dim")
        t.append(str(floor["note"]) + "\n")
    t.append("smoke ", style="dim")
    smoke = pack.smoke
    if smoke:
        t.append(f"{_pct(smoke.get('success_rate'))} success")
        failures = smoke.get("failures") or {}
        if isinstance(failures, dict):
            shown = ", ".join(f"{k} {v}" for k, v in sorted(failures.items()) if v)
            if shown:
                t.append(f"  failures: {shown}", style="yellow")
        t.append("\n")
    else:
        t.append("no smoke result recorded\n", style="dim")
    t.append("proposer read ", style="dim")
    if pack.files_read:
        t.append(", ".join(_read_label(f.tool, f.target, f.times) for f in pack.files_read) + "\n")
    elif pack.transcript is not None:
        t.append("nothing (no archive tool was called)\n")
    else:
        t.append("— (no session transcript: the proposer is not an LLM)\n", style="dim")
    if pack.transcript is not None:
        n = len(pack.transcript.get("entries") or [])
        t.append("transcript ", style="dim")
        t.append(f"{n} entries; press {transcript_key} to read it\n")
    return t


def _read_label(tool: str, target: str, times: int) -> str:
    what = target if tool == "read_file" else f"{tool} {target}"
    return what + (f" ×{times}" if times > 1 else "")


def pair_cells(p: PairedTask) -> tuple[Text, ...]:
    return (
        Text(p.task_id),
        Text(f"{p.incoming:.2f}", justify="right"),
        Text(f"{p.candidate:.2f}", justify="right"),
        Text(p.change, style=CHANGE_STYLE[p.change]),
    )


def _shown(value: Any) -> str:
    s = value if isinstance(value, str) else ("" if value is None else str(value))
    if len(s) <= SHOWN_CHARS:
        return s
    return s[:SHOWN_CHARS] + f"\n[... {len(s) - SHOWN_CHARS:,} more characters in the file]"


def transcript_text(data: dict[str, Any]) -> Text:
    """A proposer session in order: requests, replies with their tool calls, tool results."""
    t = Text()
    usage = data.get("usage") or {}
    t.append(f"session {data.get('session_id', '?')}", style="bold")
    t.append(f"  proposer {data.get('proposer', '?')}")
    if data.get("model"):
        t.append(f"  model {data['model']}")
    t.append(
        f"\n{usage.get('requests', 0)} requests · {usage.get('tool_calls', 0)} tool calls · "
        f"{usage.get('prompt_tokens', 0)}+{usage.get('completion_tokens', 0)} tokens · "
        f"{data.get('seconds', 0)} s\n",
        style="dim",
    )
    if data.get("error"):
        t.append("error: ", style="bold red")
        t.append(str(data["error"]) + "\n")
    if data.get("note"):
        t.append("note: ", style="bold yellow")
        t.append(str(data["note"]) + "\n")
    entries = [e for e in data.get("entries") or [] if isinstance(e, dict)]
    for entry in entries[:SHOWN_ENTRIES]:
        _entry(t, entry)
    hidden = len(entries) - SHOWN_ENTRIES
    if hidden > 0:
        t.append(f"\n[{hidden:,} more entries in the file]\n", style="dim")
    dropped = int(data.get("entries_dropped") or 0)
    if dropped:
        t.append(f"\n[{dropped:,} entries were not recorded: the transcript cap]\n", style="dim")
    return t


def _entry(t: Text, e: dict[str, Any]) -> None:
    kind = str(e.get("kind", "?"))
    stamp = f"  +{e.get('t', 0)} s"
    if kind == "request":
        t.append(f"\n── request {e.get('index', '?')}", style="bold blue")
        t.append(f"{stamp} · {e.get('messages_total', 0)} messages", style="dim")
        if e.get("max_tokens"):
            t.append(f" · max_tokens {e['max_tokens']}", style="dim")
        t.append("\n")
        for m in e.get("messages") or []:
            if isinstance(m, dict):
                t.append(f"[{m.get('role', '?')}] ", style="bold magenta")
                t.append(_shown(m.get("content", "")) + "\n")
    elif kind == "reply":
        t.append(f"\n── reply {e.get('index', '?')}", style="bold green")
        t.append(f"{stamp} · finish {e.get('finish_reason')}", style="dim")
        t.append("\n")
        if e.get("content"):
            t.append(_shown(e["content"]) + "\n")
        for call in e.get("tool_calls") or []:
            if isinstance(call, dict):
                t.append("   → ", style="bold cyan")
                t.append(f"{call.get('name', '?')}", style="bold cyan")
                t.append(f"({_shown(call.get('arguments', ''))})\n")
        total = int(e.get("tool_calls_total") or 0)
        kept = len(e.get("tool_calls") or [])
        if total > kept:
            t.append(f"   ({total - kept} more tool calls not recorded)\n", style="dim")
    elif kind == "tool":
        t.append(f"   ← {e.get('name', '?')}", style="bold blue")
        t.append(f"{stamp}\n", style="dim")
        t.append(_shown(e.get("result", "")) + "\n")
    else:
        t.append(f"\n── {kind}{stamp} ", style="bold yellow")
        t.append(_shown(e.get("message", "")) + "\n")


STEER_STYLE = {"sent": "yellow", "noted": "cyan", "applied": "bold green", "not applicable": "dim"}


def steer_history(notes: list[Any], sent: dict[str, str], candidates: Any = None) -> Text:
    """The notes written so far, newest first: sent (not yet recorded by the engine), noted
    (waiting for a proposer session), applied or not applicable (with the session it went to
    and, from `candidates` (the view's), what that session wrote and how it scored)."""
    t = Text()
    rows = [("sent", nid, text, "") for nid, text in sent.items()]
    for n in notes:
        where = f"cycle {n.cycle} iteration {n.iteration} ({n.proposer})" if n.iteration else ""
        where += f": {n.detail}" if n.detail else ""
        wrote = [
            f"{c.candidate_id} {_pct(c.success_rate)}"
            for c in (candidates or {}).values()
            if n.iteration and (c.cycle, c.iteration) == (n.cycle, n.iteration)
        ]
        if wrote:
            where += "; wrote " + ", ".join(wrote)
        rows.append((n.status, n.note_id, n.text, where))
    if not rows:
        t.append("no steer notes yet", style="dim")
        return t
    for status, nid, text, where in reversed(rows):
        t.append(f"{status:<15}", style=STEER_STYLE.get(status, ""))
        t.append(f"{nid}  ", style="dim")
        t.append(text)
        if status == "sent":
            t.append("  (the engine records it at its next safe point)", style="dim")
        elif status == "noted":
            t.append("  (waits for the next proposer session)", style="dim")
        elif where:
            t.append(f"  -> {where}", style="dim")
        t.append("\n")
    return t
