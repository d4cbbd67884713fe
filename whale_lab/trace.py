"""An episode's full record: what the model saw and said, what the harness parsed, what happened.

Traces are the raw material of everything downstream: RSFT trains on the turns of accepted
traces, the harness proposer reads them, diagnostics count their failure kinds, the TUI shows them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STOP_REASONS = (
    "answered",        # math/search: a final answer was given (reward says whether it was right)
    "solved",          # chess: the whole line was played
    "wrong_move",      # chess: a legal but wrong move
    "format_failure",  # the format retry budget ran out
    "illegal_moves",   # chess: the illegal-move retry budget ran out
    "turn_cap",        # MAX_TURNS reached without an end
    "token_cap",       # the prompt no longer fits the model's context
    "harness_error",   # harness code raised, hung, returned the wrong type or died
    "backend_error",   # the model backend failed for this episode
)

# Keys that could carry a reference answer inside a trace's `info`; dropped before any trace is
# written, so no file a proposer, a harness or a person browsing the run folder reads names one.
PRIVATE_INFO_KEYS = frozenset(
    {
        "answer",
        "answers",
        "reference",
        "references",
        "gold",
        "solution",
        "target",
        "ground_truth",
        "expected",
        "verifier",
        # computed from the reference answers: engine-side diagnostics only, never on disk
        "retrieval_recall",
        "answer_in_results",
    }
)


def scrub_trace(record: dict[str, Any]) -> dict[str, Any]:
    """A trace record without the `info` keys that could name the reference answer."""
    rec = dict(record)
    info = rec.get("info")
    if isinstance(info, dict):
        rec["info"] = {k: v for k, v in info.items() if str(k).lower() not in PRIVATE_INFO_KEYS}
    return rec


@dataclass
class TurnRecord:
    prompt: list[dict[str, str]]  # the messages the model saw this turn
    response: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    action: dict[str, Any] | None = None
    observation: Any = None
    feedback: dict[str, str] | None = None  # {"kind", "detail", "text"}
    tool_error: bool = False
    # The ids the backend sampled (without the end token), so training targets what was sampled
    # and not a re-encoding of `response`; None where the backend returns no ids.
    token_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.token_ids is None:
            d.pop("token_ids")  # traces from backends without ids read as before
        return d


@dataclass
class EpisodeTrace:
    task_id: str
    domain: str
    sample: int
    harness: str
    turns: list[TurnRecord] = field(default_factory=list)
    reward: float = 0.0
    stop_reason: str = ""
    error: str = ""  # readable reason for harness_error / backend_error
    format_failures: int = 0
    illegal_moves: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    token_cap_hits: int = 0  # generations cut by max_new_tokens
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def n_turns(self) -> int:
        return len(self.turns)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens for t in self.turns)

    @property
    def completion_tokens(self) -> int:
        return sum(t.completion_tokens for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["turns"] = [t.to_dict() for t in self.turns]
        d["n_turns"] = self.n_turns
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EpisodeTrace:
        d = dict(d)
        d.pop("n_turns", None)
        turns = [TurnRecord(**t) for t in d.pop("turns", [])]
        return cls(turns=turns, **d)
