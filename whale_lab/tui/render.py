"""Rich `Text` builders for the panels: pure functions of the view model.

Everything that may contain model output, harness code or user text goes through `Text(...)`
(never markup), so a response like "[bold]x[/bold]" is shown exactly as written.
"""

from __future__ import annotations

import json
import time
from typing import Any

from rich.text import Text

from whale_lab.events import ProbeResult
from whale_lab.trace import EpisodeTrace
from whale_lab.tui.state import CycleRow, EpisodeRow, ReviewEntry, RunView, outcome

OUTCOME_STYLE = {
    "success": "green",
    "wrong": "red",
    "failure": "yellow",
    "error": "bold magenta",
}
STATE_STYLE = {
    "waiting": "dim",
    "starting": "bold yellow",
    "running": "bold green",
    "paused": "bold yellow",
    "pausing": "yellow",
    "read-only": "bold blue",
    "stopping": "bold red",
    "completed": "bold cyan",
    "stopped": "bold yellow",
    "failed": "bold red",
    "replay": "bold blue",
}
DECISION_MARK = {
    "pending": ("●", "bold yellow"),
    "approve": ("✓", "green"),
    "edit": ("✎", "green"),
    "pin": ("★", "cyan"),
    "reject": ("✗", "red"),
}


def fmt_int(n: float) -> str:
    return f"{int(n):,}"


def fmt_tokens(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 1_000:
        return f"{n / 1_000:.1f}k"
    return str(int(n))


def fmt_duration(seconds: float) -> str:
    s = int(max(0.0, seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def fmt_pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def fmt_num(x: float) -> str:
    return f"{x:g}" if float(x).is_integer() else f"{x:.3g}"


def _kv(text: Text, key: str, value: str, style: str = "bold") -> None:
    text.append(f"{key} ", style="dim")
    text.append(value, style=style)


def status_line(view: RunView, *, state: str, fallback: dict[str, str]) -> Text:
    """Run, model, domain, schedule and the engine's state."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f" {state.upper()} ", style=f"reverse {STATE_STYLE.get(state, 'bold')}")
    t.append(" ")
    run = fallback.get("path") or view.run_id or fallback.get("run", "")
    if run:
        t.append(run, style="bold")
        t.append("  ")
    _kv(t, "model", view.model or fallback.get("model", "?"))
    t.append("  ")
    _kv(t, "domain", view.domain or fallback.get("domain", "?"))
    t.append("  ")
    _kv(t, "schedule", view.schedule or fallback.get("schedule", "?"))
    if view.weight_sync:
        t.append("  ")
        _kv(t, "weights", view.weight_sync, style=SYNC_STYLE.get(view.weight_sync, ""))
    note = fallback.get("note", "")
    if note:
        t.append(f"  {note}", style="bold yellow")
    return t


# The served policy checked against the trained one after the last publish.
SYNC_STYLE = {"verified": "bold green", "unverified": "bold yellow", "skipped": "dim"}


UNIT_SHORT = {"epochs": "ep", "iterations": "it"}


def phase_label(view: RunView) -> Text:
    """The phase and how far it is (`step 3/38`, `it 2/6`), the scoring or proposer session
    under way (`val 96/256`), and the time left in the phase and the run."""
    t = Text(no_wrap=True, overflow="ellipsis")
    act = view.activity
    if not view.cycle:
        t.append("start evaluation" if act.activity is not None else "no phase yet", style="dim")
    else:
        _kv(t, "cycle", str(view.cycle))
        t.append(" · ", style="dim")
        style = "bold cyan" if view.phase == "weight" else "bold magenta"
        t.append(view.phase or "?", style=style)
        steps = act.weight_step_text() if view.phase == "weight" else ""
        if steps and view.phase_active:
            t.append(f" {steps}")
        elif view.phase_unit:
            unit = UNIT_SHORT.get(view.phase_unit, view.phase_unit)
            t.append(f" {fmt_num(view.phase_done)}/{fmt_num(view.phase_budget)} {unit}")
        if not view.phase_active and view.last_phase_end:
            t.append(f" · ended ({view.last_phase_end})", style="dim")
    if act.activity is not None and not view.finished:
        t.append(" · ", style="dim")
        t.append(act.activity.text(), style="bold")
    if view.finished or not act.live:
        return t
    left = act.phase_left(view.phase, view.phase_done, view.phase_budget)
    if not view.phase_active:
        left = act.activity.left_seconds if act.activity is not None else None
    if left is not None:
        t.append(" · ", style="dim")
        _kv(t, "left", fmt_duration(left), style="")
    run_left = act.run_left(view.phase, view.phase_done, view.phase_budget, view.phase_active)
    t.append(" · ", style="dim")
    _kv(t, "run", "~" + fmt_duration(run_left) if run_left is not None else "—", style="")
    return t


def rates_text(view: RunView, now: float | None = None) -> str:
    """`3.2 ep/s 410 tok/s` over the last half minute of episodes ("" when not live)."""
    act = view.activity
    if not act.live:
        return ""
    rates = act.rates(now if now is not None else time.time())
    if rates is None:
        return ""
    eps, toks = rates
    return f"{eps:.1f} ep/s {fmt_tokens(toks)} tok/s"


def accounting_line(view: RunView) -> Text:
    """Rollouts, proposer spend and the harness in use."""
    t = Text(no_wrap=True, overflow="ellipsis")
    _kv(t, "rollouts W", fmt_int(view.weight_rollouts))
    t.append(" ")
    _kv(t, "H", fmt_int(view.harness_rollouts))
    if view.other_rollouts:
        t.append(" ")
        _kv(t, "eval", fmt_int(view.other_rollouts), style="")
    rates = rates_text(view)
    if rates:
        t.append("  │ ", style="dim")
        t.append(rates, style="bold")
    t.append("  │ ", style="dim")
    toks = view.proposer_prompt_tokens + view.proposer_completion_tokens
    _kv(t, "proposer", f"{fmt_tokens(toks)} tok ${view.proposer_cost:.2f}")
    t.append("  │ ", style="dim")
    _kv(t, "harness", harness_shown(view), style="bold green")
    pending = len(view.pending_reviews)
    if pending:
        t.append(f"  {pending} to review", style="bold yellow")
    return t


# ------------------------------------------------------------------ rollouts

EPISODE_COLUMNS = ("#", "cyc", "phase", "task", "s", "turns", "reward", "stop", "harness")


def episode_cells(row: EpisodeRow) -> tuple[Text, ...]:
    style = OUTCOME_STYLE[row.outcome]
    return (
        Text(str(row.index + 1), style="dim"),
        Text(str(row.cycle)),
        Text(row.phase),
        Text(row.task_id),
        Text(str(row.sample)),
        Text(str(row.turns), justify="right"),
        Text(f"{row.reward:.2f}", style=style, justify="right"),
        Text(row.stop_reason, style=style),
        Text(row.harness),
    )


def outcome_summary(view: RunView) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    total = max(1, view.episode_count)
    for name in ("success", "wrong", "failure", "error"):
        n = view.outcome_counts.get(name, 0)
        t.append(f"{name} {n} ({100 * n / total:.0f}%)", style=OUTCOME_STYLE[name])
        t.append("  ")
    return t


# ------------------------------------------------------------------ traces


def _fmt_value(value: Any) -> str:
    """Strings as they are; JSON on one line, with empty fields of a dict left out."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        value = {k: v for k, v in value.items() if v not in ("", None, {}, [])}
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def trace_text(trace: EpisodeTrace) -> Text:
    """Every message, response, parsed action, observation and feedback of one episode."""
    t = Text()
    style = OUTCOME_STYLE[_trace_outcome(trace)]
    t.append(f"task {trace.task_id}", style="bold")
    t.append(f"  sample {trace.sample}  domain {trace.domain}  harness {trace.harness}\n")
    t.append(f"reward {trace.reward:.2f}  ", style=style)
    t.append(f"stop {trace.stop_reason}", style=style)
    t.append(
        f"  turns {trace.n_turns}  tokens {trace.prompt_tokens}+{trace.completion_tokens}"
        f"  format failures {trace.format_failures}  illegal {trace.illegal_moves}"
        f"  tools {trace.tool_calls} (errors {trace.tool_errors})\n"
    )
    if trace.error:
        t.append("error: ", style="bold red")
        t.append(trace.error + "\n")
    shown: list[dict[str, str]] = []
    for i, turn in enumerate(trace.turns, start=1):
        t.append(f"\n── turn {i} ", style="bold")
        t.append(
            f"finish {turn.finish_reason} · prompt {turn.prompt_tokens} tok · "
            f"completion {turn.completion_tokens} tok\n",
            style="dim",
        )
        prompt = list(turn.prompt)
        if shown and prompt[: len(shown)] == shown:
            t.append(f"   ({len(shown)} earlier messages)\n", style="dim")
            new = prompt[len(shown) :]
        else:
            new = prompt
        for msg in new:
            _message(t, str(msg.get("role", "?")), str(msg.get("content", "")))
        _message(t, "assistant", turn.response, label="model")
        if turn.action is not None:
            t.append("   → action ", style="bold cyan")
            t.append(_fmt_value(turn.action) + "\n")
        if turn.observation is not None:
            t.append("   ← observation ", style="bold blue")
            t.append(_fmt_value(turn.observation) + "\n")
        if turn.feedback:
            kind = turn.feedback.get("kind", "")
            t.append(f"   ! feedback ({kind}) ", style="bold yellow")
            t.append(str(turn.feedback.get("text") or turn.feedback.get("detail", "")) + "\n")
        if turn.tool_error:
            t.append("   ! tool error\n", style="bold red")
        shown = prompt + [{"role": "assistant", "content": turn.response}]
    if trace.info:
        t.append("\ninfo ", style="bold")
        t.append(_fmt_value(trace.info) + "\n")
    return t


def _message(t: Text, role: str, content: str, label: str | None = None) -> None:
    style = {"system": "bold magenta", "user": "bold blue", "assistant": "bold green"}.get(
        role, "bold"
    )
    t.append(f"[{label or role}] ", style=style)
    t.append(content)
    t.append("\n")


def _trace_outcome(trace: EpisodeTrace) -> str:
    return outcome(trace.reward, trace.stop_reason)


# ------------------------------------------------------------------ accuracy


CYCLE_COLUMNS = ("cycle", "weight", "harness", "rollouts W/H", "accepted", "val", "test")


def cycle_cells(row: CycleRow) -> tuple[Text, ...]:
    def budget(done: float, total: float, unit: str) -> str:
        if not total:
            return "—"
        short = UNIT_SHORT.get(unit, unit)
        return f"{fmt_num(done)}/{fmt_num(total)} {short}"

    accepted = row.accepted or "—"
    if row.accepted and row.accepted_score is not None:
        accepted += f" ({row.accepted_score:.2f})"
    return (
        Text(str(row.cycle)),
        Text(budget(row.weight_done, row.weight_budget, row.weight_unit)),
        Text(budget(row.harness_done, row.harness_budget, row.harness_unit)),
        Text(f"{fmt_int(row.weight_rollouts)}/{fmt_int(row.harness_rollouts)}"),
        Text(accepted, style="green" if row.accepted else "dim"),
        Text(fmt_pct(row.val), style="bold"),
        Text(fmt_pct(row.test)),
    )


def accuracy_summary(view: RunView) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    for split in ("val", "test"):
        pts = [p for p in view.evals if p.split == split]
        if pts:
            last, best = pts[-1], max(p.mean_at_k for p in pts)
            _kv(t, f"{split} mean@{last.k}", fmt_pct(last.mean_at_k))
            t.append(f" (best {fmt_pct(best)})  ", style="dim")
    if not view.evals:
        t.append("no evaluations yet", style="dim")
    return t


# ------------------------------------------------------------------ review


def review_option(entry: ReviewEntry, *, live: bool) -> Text:
    mark, style = DECISION_MARK.get(entry.status, ("?", ""))
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"{mark} ", style=style)
    t.append(entry.candidate_id, style="bold")
    t.append(f"  {entry.surface}  ", style="cyan")
    if entry.status == "pending":
        t.append("awaiting you" if live else "awaiting (resume the run to decide)", style=style)
    else:
        t.append(entry.status, style=style)
        if entry.reason:
            t.append(f": {entry.reason}", style="dim")
    return t


def review_meta(entry: ReviewEntry, *, live: bool) -> Text:
    t = Text()
    t.append(entry.candidate_id, style="bold")
    if entry.parent_id:
        t.append(f"  parent {entry.parent_id}", style="dim")
    if entry.cycle or entry.iteration:
        t.append(f"  cycle {entry.cycle} iteration {entry.iteration}", style="dim")
    if entry.proposer:
        t.append(f"  proposer {entry.proposer}", style="dim")
    t.append("\n")
    _kv(t, "surface", entry.surface, style="bold cyan")
    t.append("   ")
    smoke = "—" if entry.smoke_success is None else fmt_pct(entry.smoke_success)
    _kv(t, "smoke run", smoke)
    t.append("   ")
    mark, style = DECISION_MARK.get(entry.status, ("?", ""))
    _kv(t, "status", f"{mark} {entry.status}", style=style)
    if entry.status == "pending" and not live:
        t.append("  (no engine is waiting: resume the run to decide)", style="dim")
    t.append("\n")
    if entry.reason:
        _kv(t, "reason", entry.reason, style="")
        t.append("\n")
    t.append("hypothesis ", style="dim")
    t.append(entry.hypothesis or "—")
    t.append("\n")
    if entry.cited_traces:
        t.append("cites ", style="dim")
        t.append(", ".join(entry.cited_traces))
        t.append("\n")
    if entry.noise_floor:
        t.append("noise floor ", style="dim")
        t.append(entry.noise_floor)
        t.append("\n")
    if entry.transcript:
        t.append("proposer session ", style="dim")
        t.append(entry.transcript)
        t.append("\n")
    return t


# ------------------------------------------------------------------ control


def probe_text(probes: list[ProbeResult], running: bool) -> Text:
    t = Text()
    if running:
        t.append("probe running…\n", style="bold yellow")
    if not probes:
        if not running:
            t.append(
                "no probe yet: press the probe key to measure which component is the bottleneck",
                style="dim",
            )
        return t
    p = probes[-1]
    t.append("last probe: ", style="dim")
    t.append(p.recommendation, style="bold")
    t.append("\n")
    t.append(
        f"gain per 1k rollouts: harness {p.harness_gain_per_1k:+.3f}  "
        f"weights {p.weight_gain_per_1k:+.3f}\n"
    )
    for line in p.evidence:
        t.append(f"  · {line}\n")
    return t


def log_line(ts: float, level: str, message: str, start: float | None) -> Text:
    style = {"warning": "yellow", "error": "bold red"}.get(level, "")
    t = Text()
    rel = fmt_duration(ts - start) if start is not None and ts else "--:--"
    t.append(f"{rel} ", style="dim")
    t.append(f"{level[:4]:<4} ", style=style or "dim")
    t.append(message, style=style)
    return t


def harness_shown(view: RunView) -> str:
    """The harness in use: the base one by the path it came from (`harnesses/math/h0.py`),
    an accepted candidate by its path in the run folder."""
    harness = view.harness or view.base_harness
    source = view.activity.harness_source
    if source and harness == view.base_harness:
        return source
    return harness or "?"
