"""What a probe's numbers and traces say: the diagnostics it reads, the signals they raise, and
the one-sentence recommendation (which lever to pull next) with its evidence.

Pure functions of traces and gains, so they are tested without running anything.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from whale_lab import metrics
from whale_lab.paired import MIN_TASKS
from whale_lab.trace import EpisodeTrace

# Trace signals: thresholds above (or below) which a diagnostic points at one side.
FORMAT_FAILURE_HIGH = 0.2  # share of turns (or episodes) whose reply could not be parsed
TOOL_ERROR_HIGH = 0.2  # share of tool calls that failed
TURN_CAP_HIGH = 0.2  # share of episodes that ran out of turns
TOKEN_CAP_HIGH = 0.2  # share of turns cut by max_new_tokens
CONTEXT_OVERFLOW_HIGH = 0.1  # share of episodes whose prompt outgrew the context
RECALL_LOW = 0.5  # search: share of episodes where a retrieved passage held the answer
LEGAL_MOVE_LOW = 0.8  # chess: share of attempted moves that were legal
GAP_HIGH = 0.15  # pass@k - mean@k: solved sometimes, not reliably
ANSWERED_HIGH = 0.7  # share of episodes that end in a well-formed answer ...
ANSWER_ACCURACY_LOW = 0.3  # ... of which this share or less is right
# Gains closer than this share of the larger one are a tie (decided by the traces).
TIE_SHARE = 0.2
GAIN_EPS = 1e-9


# ---------------------------------------------------------------------------- diagnostics


def probe_diagnostics(traces: Sequence[EpisodeTrace], *, domain: str, k: int) -> dict[str, float]:
    """`metrics.diagnostics` plus what a probe reads: mean@k, pass@k and their gap, and the
    legal-move rate (chess: legal moves over attempted moves)."""
    out = dict(metrics.diagnostics(traces))
    if not traces:
        return out
    mean = metrics.mean_at_k(traces)
    pass_k = metrics.pass_at_k(traces, k)
    out["mean_at_k"] = mean
    out["pass_at_k"] = pass_k
    out["pass_mean_gap"] = max(0.0, pass_k - mean)
    moves = sum(1 for t in traces for turn in t.turns if (turn.action or {}).get("kind") == "move")
    if domain == "chess" or moves:
        illegal = sum(t.illegal_moves for t in traces)
        if moves:
            out["legal_move_rate"] = max(0.0, (moves - illegal) / moves)
    return out


@dataclass(frozen=True)
class Signal:
    """One diagnostic that points at one side, in words."""

    side: Literal["harness", "weights"]
    key: str
    value: float
    text: str


def read_signals(diag: dict[str, float], domain: str) -> list[Signal]:
    """The diagnostics that point at the harness or at the weights, strongest first per side."""
    out: list[Signal] = []
    if not diag or not diag.get("episodes"):
        return out
    fmt = max(diag.get("format_failure_rate", 0.0), diag.get("stop_format_failure", 0.0))
    if fmt >= FORMAT_FAILURE_HIGH:
        out.append(
            Signal(
                "harness",
                "format_failure_rate",
                fmt,
                f"format failures: {fmt:.0%} of replies could not be parsed; the "
                "format instructions, parser or feedback (harness) hold the score down",
            )
        )
    tool = diag.get("tool_error_rate", 0.0)
    if tool >= TOOL_ERROR_HIGH:
        out.append(
            Signal(
                "harness",
                "tool_error_rate",
                tool,
                f"tool errors: {tool:.0%} of tool calls failed; how tool calls are "
                "parsed and results shown (harness tool I/O) is the first thing to fix",
            )
        )
    turn_cap = diag.get("stop_turn_cap", 0.0)
    if turn_cap >= TURN_CAP_HIGH:
        out.append(
            Signal(
                "harness",
                "stop_turn_cap",
                turn_cap,
                f"turn cap: {turn_cap:.0%} of episodes ran out of turns; the turn budget "
                "or stop rule (harness termination) cuts episodes short",
            )
        )
    token_cap = diag.get("token_cap_rate", 0.0)
    overflow = diag.get("stop_token_cap", 0.0)
    if token_cap >= TOKEN_CAP_HIGH or overflow >= CONTEXT_OVERFLOW_HIGH:
        out.append(
            Signal(
                "harness",
                "token_cap",
                max(token_cap, overflow),
                f"token cap: {token_cap:.0%} of replies were cut by the token limit and "
                f"{overflow:.0%} of episodes outgrew the context; context management "
                "and reply-length instructions (harness) are the limit",
            )
        )
    if domain == "search" and "retrieval_recall" in diag:
        recall = diag["retrieval_recall"]
        if recall < RECALL_LOW:
            out.append(
                Signal(
                    "harness",
                    "retrieval_recall",
                    recall,
                    f"retrieval recall: a retrieved passage held the answer in only "
                    f"{recall:.0%} of episodes; how queries are formed and how many "
                    "passages are shown (harness) limit what the model can answer",
                )
            )
    if "legal_move_rate" in diag:
        legal = diag["legal_move_rate"]
        if legal < LEGAL_MOVE_LOW:
            out.append(
                Signal(
                    "harness",
                    "legal_move_rate",
                    legal,
                    f"legal moves: only {legal:.0%} of attempted moves were legal; how "
                    "the board and the legal moves are shown, and the parser (harness), "
                    "come first",
                )
            )
    pass_k = diag.get("pass_at_k")
    mean = diag.get("mean_at_k")
    if pass_k is not None and mean is not None:
        gap = pass_k - mean
        if gap >= GAP_HIGH:
            out.append(
                Signal(
                    "weights",
                    "pass_mean_gap",
                    gap,
                    f"pass@k {pass_k:.0%} vs mean@k {mean:.0%}: the model solves tasks "
                    "in some samples but not reliably; rejection-sampling fine-tuning "
                    "has correct rollouts to learn from (weights)",
                )
            )
        if pass_k <= 0.0:
            out.append(
                Signal(
                    "harness",
                    "pass_at_k",
                    pass_k,
                    "no val task was solved in any sample: RSFT would keep no rollout, "
                    "so weight training cannot move until the harness yields some "
                    "successes",
                )
            )
    answered = diag.get("stop_answered", 0.0)
    accuracy = diag.get("accuracy_when_answered")
    # (with nothing solved at all RSFT has nothing to learn from: that case points at the harness)
    if (
        accuracy is not None
        and answered >= ANSWERED_HIGH
        and accuracy <= ANSWER_ACCURACY_LOW
        and fmt < FORMAT_FAILURE_HIGH
        and (pass_k or 0.0) > 0.0
    ):
        out.append(
            Signal(
                "weights",
                "accuracy_when_answered",
                accuracy,
                f"answers: {answered:.0%} of episodes end in a well-formed answer but "
                f"only {accuracy:.0%} of those are right; what the model knows and "
                "how it reasons (weights) limit the score",
            )
        )
    return out


@dataclass(frozen=True)
class Recommendation:
    side: Literal["harness", "weights", "both", "unclear", "inconclusive"]
    text: str
    evidence: tuple[str, ...]


def _fmt_gain(g: float | None) -> str:
    return "not measured" if g is None else f"{g:+.3f}"


def recommend(
    harness_gain: float | None,
    weight_gain: float | None,
    signals: Sequence[Signal],
    *,
    harness_note: str = "",
    weight_note: str = "",
    harness_interval: tuple[float, float] | None = None,
    weight_interval: tuple[float, float] | None = None,
    needed: str = "",
    harness_backing: int | None = None,
    weight_backing: int | None = None,
) -> Recommendation:
    """Decide which side to work on next, from measured gains (val mean@k per 1,000 rollouts;
    None when a side could not be measured) and trace signals; say why in plain words.

    With paired intervals for the gains (what a probe measures), a side is named only when its
    interval's low end is above zero and at least `paired.MIN_TASKS` val tasks back it (tasks
    whose val mean rose: `harness_backing`, `weight_backing`; an unknown count backs nothing):
    "harness", "weights", "both", or "inconclusive" with the size that would be needed
    (`needed`); the traces are evidence then, never the verdict. Without intervals
    (gains from elsewhere) measured gains decide when one side is clearly ahead and the traces
    break ties; with nothing to go on the answer is "unclear".
    """
    if harness_interval is not None or weight_interval is not None:
        return _paired_verdict(
            harness_gain, weight_gain, signals, harness_interval, weight_interval,
            harness_note=harness_note, weight_note=weight_note, needed=needed,
            harness_backing=harness_backing, weight_backing=weight_backing,
        )
    h_votes = [s for s in signals if s.side == "harness"]
    w_votes = [s for s in signals if s.side == "weights"]
    evidence = [
        f"harness probe: val mean@k {_fmt_gain(harness_gain)} per 1,000 rollouts"
        + (f" ({harness_note})" if harness_note else ""),
        f"weight probe: val mean@k {_fmt_gain(weight_gain)} per 1,000 rollouts"
        + (f" ({weight_note})" if weight_note else ""),
    ]
    evidence += [s.text for s in signals]
    side: Literal["harness", "weights", "unclear"] = "unclear"
    why = ""
    gains = {"harness": harness_gain, "weights": weight_gain}
    measured = {k: v for k, v in gains.items() if v is not None and math.isfinite(v)}
    best_side = max(measured, key=lambda s: measured[s]) if measured else None
    if best_side is not None and measured[best_side] > GAIN_EPS:
        other = "weights" if best_side == "harness" else "harness"
        other_gain = measured.get(other)
        top = measured[best_side]
        if other_gain is None or top - other_gain > TIE_SHARE * max(abs(top), abs(other_gain)):
            side = best_side  # type: ignore[assignment]
            what = "a short harness search" if side == "harness" else "a few RSFT steps"
            vs = (
                f" vs {other_gain:+.3f} for the " + ("weights" if other == "weights" else "harness")
                if other_gain is not None
                else ""
            )
            why = f"{what} gained {top:+.3f} val mean@k per 1,000 rollouts{vs}"
        else:
            why = "both probes gained about as much"
    elif measured:
        why = "neither probe improved val mean@k"
    else:
        why = "neither probe could be measured"
    if side == "unclear":
        if len(h_votes) > len(w_votes):
            side = "harness"
            why += f"; the traces point at the harness ({h_votes[0].text.split(':')[0]})"
        elif len(w_votes) > len(h_votes):
            side = "weights"
            why += f"; the traces point at the weights ({w_votes[0].text.split(':')[0]})"
    if side == "harness":
        text = (
            f"The harness is the bottleneck now: {why}. Run a harness phase next "
            "(switch phase now if a weight phase is running)."
        )
    elif side == "weights":
        text = (
            f"The weights are the bottleneck now: {why}. Run a weight phase (RSFT) next "
            "(switch phase now if a harness phase is running)."
        )
    else:
        text = (
            f"No clear bottleneck: {why}, and the traces do not point at one side. Keep the "
            "schedule, or probe again with a larger budget."
        )
    return Recommendation(side, text, tuple(evidence))


def _fmt_interval(gain: float | None, interval: tuple[float, float] | None) -> str:
    if gain is None:
        return "not measured"
    if interval is None:
        return f"{gain:+.3f} (no interval)"
    return f"{gain:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]"


def interval_supports(interval: tuple[float, float] | None, backing: int | None) -> bool:
    """A gain is supported when its paired interval's low end is above zero and at least
    `MIN_TASKS` tasks back it (won: their val mean rose). A percentile bootstrap over a handful of
    changed tasks among many ties is narrow by construction: 4 tasks up, none down and 20 tied
    give a low end above zero, while a sign test on those 4 gives p = 0.125."""
    return (
        interval is not None
        and math.isfinite(interval[0])
        and interval[0] > GAIN_EPS
        and backing is not None
        and backing >= MIN_TASKS
    )


def _paired_verdict(
    harness_gain: float | None,
    weight_gain: float | None,
    signals: Sequence[Signal],
    harness_interval: tuple[float, float] | None,
    weight_interval: tuple[float, float] | None,
    *,
    harness_note: str,
    weight_note: str,
    needed: str,
    harness_backing: int | None = None,
    weight_backing: int | None = None,
) -> Recommendation:
    evidence = [
        "harness probe: val mean@k per 1,000 rollouts "
        + _fmt_interval(harness_gain, harness_interval)
        + (f" ({harness_note})" if harness_note else ""),
        "weight probe: val mean@k per 1,000 rollouts "
        + _fmt_interval(weight_gain, weight_interval)
        + (f" ({weight_note})" if weight_note else ""),
        "intervals: 95% percentile bootstrap over val tasks, paired (same tasks, same seeds)",
    ]
    evidence += [s.text for s in signals]
    counts = {"harness": harness_backing, "weights": weight_backing}
    intervals = {"harness": harness_interval, "weights": weight_interval}
    supported = {side for side in counts if interval_supports(intervals[side], counts[side])}
    # an interval above zero on too few tasks: said, never named
    thin = [
        f"the {side} interval is above zero but only {counts[side] or 0} val tasks back it "
        f"(rose; at least {MIN_TASKS} are needed)"
        for side in counts
        if side not in supported
        and intervals[side] is not None
        and intervals[side][0] > GAIN_EPS  # type: ignore[index]
    ]
    if supported == {"harness", "weights"}:
        return Recommendation(
            "both",
            "Both levers help now: each probe's gain excludes zero "
            f"(harness {_fmt_interval(harness_gain, harness_interval)}, weights "
            f"{_fmt_interval(weight_gain, weight_interval)} per 1,000 rollouts). Keep alternating.",
            tuple(evidence),
        )
    if supported:
        side = next(iter(supported))
        gain, interval = (
            (harness_gain, harness_interval) if side == "harness" else (weight_gain, weight_interval)
        )
        what = "harness phase" if side == "harness" else "weight phase (RSFT)"
        name = "harness" if side == "harness" else "weights"
        return Recommendation(
            side,  # type: ignore[arg-type]
            f"The {name} {'is' if side == 'harness' else 'are'} the bottleneck now: its probe gained "
            f"{_fmt_interval(gain, interval)} val mean@k per 1,000 rollouts, an interval that "
            f"excludes zero with {counts[side]} val tasks up, and the other side's does not. "
            f"Run a {what} next.",
            tuple(evidence),
        )
    leaning = ""
    h_votes = [s for s in signals if s.side == "harness"]
    w_votes = [s for s in signals if s.side == "weights"]
    if len(h_votes) != len(w_votes):
        lean = "harness" if len(h_votes) > len(w_votes) else "weights"
        leaning = f" The traces lean towards the {lean}, which the measured gains do not confirm."
    return Recommendation(
        "inconclusive",
        "Inconclusive: no difference detected at this size (neither probe's gain interval excludes "
        f"zero with at least {MIN_TASKS} val tasks up: harness "
        f"{_fmt_interval(harness_gain, harness_interval)}, weights "
        f"{_fmt_interval(weight_gain, weight_interval)} per 1,000 rollouts"
        + (f"; {'; '.join(thin)}" if thin else "")
        + ")."
        + (f" {needed}" if needed else "")
        + leaning,
        tuple(evidence),
    )
