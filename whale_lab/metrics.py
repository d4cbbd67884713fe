"""Scores and the diagnostics that say where failures come from.

An episode whose generation failed at the backend (a refused request, a timeout, an unusable
answer) says nothing about the harness or the weights: it is invalid, left out of mean@k, pass@k
and the success rate, and counted on its own (`invalid_episodes`, `invalid_share`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from whale_lab.trace import PRIVATE_INFO_KEYS, EpisodeTrace


def is_invalid(trace: EpisodeTrace) -> bool:
    """True when a generation of the episode ended with a backend error (not a model failure)."""
    return trace.stop_reason == "backend_error" or any(
        turn.finish_reason == "error" for turn in trace.turns
    )


def valid(traces: Iterable[EpisodeTrace]) -> list[EpisodeTrace]:
    """The episodes that count for scores."""
    return [t for t in traces if not is_invalid(t)]


def _by_task(traces: Iterable[EpisodeTrace]) -> dict[str, list[float]]:
    groups: dict[str, list[float]] = defaultdict(list)
    for t in valid(traces):
        groups[t.task_id].append(float(t.reward))
    return groups


def mean_at_k(traces: Sequence[EpisodeTrace]) -> float:
    """Per-task mean correctness over its samples, averaged over tasks (the paper's mean@k)."""
    groups = _by_task(traces)
    if not groups:
        return 0.0
    return sum(sum(v) / len(v) for v in groups.values()) / len(groups)


def _pass_at_k_task(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k(
    traces: Sequence[EpisodeTrace], k: int | None = None, threshold: float = 0.5
) -> float:
    groups = _by_task(traces)
    if not groups:
        return 0.0
    total = 0.0
    for rewards in groups.values():
        n = len(rewards)
        c = sum(r > threshold for r in rewards)
        total += _pass_at_k_task(n, c, min(k or n, n))
    return total / len(groups)


def success_rate(traces: Sequence[EpisodeTrace], threshold: float = 0.5) -> float:
    scored = valid(traces)
    if not scored:
        return 0.0
    return sum(t.reward > threshold for t in scored) / len(scored)


def diagnostics(traces: Sequence[EpisodeTrace]) -> dict[str, float]:
    """Rates per episode (and per turn where that reads better), for eval output and probes."""
    n = len(traces)
    if n == 0:
        return {}
    turns = sum(t.n_turns for t in traces) or 1
    stop = defaultdict(int)
    for t in traces:
        stop[t.stop_reason] += 1
    tool_calls = sum(t.tool_calls for t in traces)
    out: dict[str, float] = {
        "episodes": float(n),
        "mean_turns": sum(t.n_turns for t in traces) / n,
        "mean_tokens": sum(t.prompt_tokens + t.completion_tokens for t in traces) / n,
        "mean_completion_tokens": sum(t.completion_tokens for t in traces) / n,
        # per-turn rates
        "format_failure_rate": sum(t.format_failures for t in traces) / turns,
        "token_cap_rate": sum(t.token_cap_hits for t in traces) / turns,
        "tool_error_rate": (sum(t.tool_errors for t in traces) / tool_calls) if tool_calls else 0.0,
        "tool_calls_per_episode": tool_calls / n,
        "illegal_move_rate": sum(t.illegal_moves for t in traces) / turns,
        # turns where the harness, not the model, picked the move (a chess fallback)
        "harness_chose_move": sum(
            1
            for t in traces
            for turn in t.turns
            if isinstance(turn.feedback, dict) and turn.feedback.get("kind") == "harness_chose_move"
        )
        / turns,
    }
    invalid = sum(is_invalid(t) for t in traces)
    out["invalid_episodes"] = float(invalid)
    out["invalid_share"] = invalid / n
    for reason in (
        "answered",
        "solved",
        "wrong_move",
        "format_failure",
        "illegal_moves",
        "turn_cap",
        "token_cap",
        "harness_error",
        "backend_error",
    ):
        out[f"stop_{reason}"] = stop.get(reason, 0) / n
    recalls = [t.info["retrieval_recall"] for t in traces if "retrieval_recall" in t.info]
    if recalls:
        out["retrieval_recall"] = sum(float(r) for r in recalls) / len(recalls)
    answered = [t for t in valid(traces) if t.stop_reason == "answered"]
    if answered:
        out["accuracy_when_answered"] = sum(t.reward > 0.5 for t in answered) / len(answered)
    # an LLM judge scored the answers: exact match is reported beside it, over the same episodes
    judged = [t for t in valid(traces) if "judge" in t.info]
    if judged:
        out["exact_match"] = sum(bool(t.info.get("em")) for t in judged) / len(judged)
        answered_judged = [t for t in judged if t.info.get("judge") is not None]
        if answered_judged:
            out["judge_fallback_share"] = sum(
                t.info.get("judge") == "fallback" for t in answered_judged
            ) / len(answered_judged)
    return out


# Two val means this close are a tie (means of per-task means carry rounding error).
VAL_TIE_TOL = 1e-9


def reaches_best(value: float, best: float | None) -> bool:
    """Whether a val mean@k is a new best of the run or ties it (within VAL_TIE_TOL). Under
    `eval.test_every = "best"` both get their test score: a tie is broken by the paired val
    tie-break (`report.select_on_val`), which can pick the later point only if it was scored."""
    return best is None or value > best - VAL_TIE_TOL


def archive_safe(diag: dict[str, float]) -> dict[str, float]:
    """`diag` without the keys computed from the reference answers (`trace.PRIVATE_INFO_KEYS`,
    e.g. `retrieval_recall`): what may be written where a proposer reads. The engine keeps the
    full dict for its own diagnostics; one list of private keys serves traces and scores alike."""
    return {k: v for k, v in diag.items() if str(k).lower() not in PRIVATE_INFO_KEYS}


FAILURE_LABELS = {
    "format_failure_rate": "format failures (per turn)",
    "tool_error_rate": "tool errors (per tool call)",
    "illegal_move_rate": "illegal moves (per turn)",
    "stop_turn_cap": "turn-cap hits",
    "token_cap_rate": "token-cap hits (per turn)",
    "stop_token_cap": "context overflows",
    "stop_harness_error": "harness crashes",
    "stop_backend_error": "backend errors",
    "invalid_share": "invalid episodes (backend errors, not scored)",
    "harness_chose_move": "harness chose the move (not the model)",
    "stop_wrong_move": "wrong moves",
    "retrieval_recall": "retrieval recall",
}


# (key, label, unit, scale): what each domain's eval summary shows, in this order. A share is
# shown in percent of what it counts (turns, episodes, tool calls); a count per episode as is.
_COMMON_FIRST = (
    ("mean_turns", "turns", "per episode", 1.0),
    ("mean_completion_tokens", "reply tokens", "per episode", 1.0),
    ("format_failure_rate", "format failures", "% of turns", 100.0),
)
_COMMON_LAST = (
    ("token_cap_rate", "token-cap hits", "% of turns", 100.0),
    ("stop_turn_cap", "ended at the turn cap", "% of episodes", 100.0),
    ("stop_token_cap", "context overflows", "% of episodes", 100.0),
    ("stop_harness_error", "harness crashes", "% of episodes", 100.0),
    ("invalid_share", "invalid (backend errors, not scored)", "% of episodes", 100.0),
)
DOMAIN_DIAGNOSTICS: dict[str, tuple[tuple[str, str, str, float], ...]] = {
    "math": (
        *_COMMON_FIRST,
        ("tool_calls_per_episode", "python calls", "per episode", 1.0),
        ("tool_error_rate", "python errors", "% of tool calls", 100.0),
        ("accuracy_when_answered", "correct when answered", "% of answered episodes", 100.0),
        *_COMMON_LAST,
    ),
    "search": (
        *_COMMON_FIRST,
        ("tool_calls_per_episode", "searches", "per episode", 1.0),
        ("tool_error_rate", "search errors", "% of tool calls", 100.0),
        ("retrieval_recall", "retrieval recall", "%, mean over episodes", 100.0),
        ("accuracy_when_answered", "correct when answered", "% of answered episodes", 100.0),
        ("exact_match", "exact match (beside the judge)", "% of episodes", 100.0),
        (
            "judge_fallback_share",
            "judge gave no verdict (exact match decided)",
            "% of answered episodes",
            100.0,
        ),
        *_COMMON_LAST,
    ),
    "chess": (
        *_COMMON_FIRST,
        ("illegal_move_rate", "illegal moves", "% of turns", 100.0),
        ("harness_chose_move", "harness chose the move (not the model)", "% of turns", 100.0),
        ("stop_wrong_move", "ended on a wrong move", "% of episodes", 100.0),
        ("stop_illegal_moves", "ended on illegal moves", "% of episodes", 100.0),
        *_COMMON_LAST,
    ),
}
_SHOWN_STOPS = {
    key for rows in DOMAIN_DIAGNOSTICS.values() for key, *_ in rows if key.startswith("stop_")
}


def summary_rows(domain: str, diag: dict[str, float]) -> list[tuple[str, str, str]]:
    """(label, value, unit) rows of the eval summary: only the diagnostics of `domain`, each
    with its unit; any other way an episode ended follows, as a share of episodes. A domain
    not listed (a user's own) gets the common rows."""
    spec = DOMAIN_DIAGNOSTICS.get(domain, _COMMON_FIRST + _COMMON_LAST)
    rows = []
    for key, label, unit, scale in spec:
        if key in diag:
            value = diag[key] * scale
            rows.append((label, f"{value:.1f}" if scale == 100.0 else f"{value:.2f}", unit))
    for key, value in sorted(diag.items()):
        ordinary = key in ("stop_answered", "stop_solved")
        if key.startswith("stop_") and key not in _SHOWN_STOPS and not ordinary and value:
            rows.append((f"ended: {key[5:]}", f"{100 * value:.1f}", "% of episodes"))
    return rows
