"""What every domain provides: tasks in four seeded splits, an environment per episode, a verifier.

Reference answers live in `Task.answer` and never cross into harness code: the harness host only
ever receives `Task.fields` and observations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

SPLITS = ("weight", "harness", "val", "test")
Split = Literal["weight", "harness", "val", "test"]

ActionKind = Literal["answer", "tool", "move", "invalid"]


@dataclass(frozen=True)
class Task:
    id: str
    domain: str
    # Visible to the harness: fields used by USER_PROMPT, e.g. {"question": ...}. Never the answer.
    fields: Mapping[str, Any]
    # Private to the engine: what the verifier checks against.
    answer: Any
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """A parsed model turn, normalised from whatever the harness's parse_action returned."""

    kind: ActionKind
    value: str = ""  # final answer text or UCI move
    tool: str = ""  # tool name for kind == "tool"
    args: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""  # why it is invalid, for kind == "invalid"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": self.value, "tool": self.tool,
                "args": dict(self.args), "reason": self.reason}


FeedbackKind = Literal["format", "illegal", "tool_error"]


@dataclass(frozen=True)
class StepOutcome:
    """What the environment says after one action.

    Exactly one of: `done` (with reward and stop_reason), an `observation` to show next, or
    `feedback` (kind + detail) that consumes a retry budget of that kind.
    """

    done: bool = False
    reward: float = 0.0
    stop_reason: str = ""
    observation: Any = None  # JSON-serialisable; formatted by the harness's format_observation
    feedback_kind: FeedbackKind | None = None
    feedback_detail: str = ""
    tool_error: bool = False  # the tool ran but reported an error (counted for diagnostics)
    info: Mapping[str, Any] = field(default_factory=dict)


class Env(ABC):
    """One episode's environment state, engine-side."""

    @abstractmethod
    def initial_observation(self) -> Any:
        """The observation shown in the first user message (may be None)."""

    @abstractmethod
    def context(self) -> dict[str, Any]:
        """Keyword context passed to harness functions (JSON-serialisable), e.g. side_to_move."""

    @abstractmethod
    def step(self, action: Action) -> StepOutcome: ...

    def final_info(self) -> dict[str, Any]:
        """Extra per-episode facts for diagnostics (e.g. retrieval recall). JSON-serialisable."""
        return {}


class Domain(ABC):
    name: str

    @abstractmethod
    def tasks(self, split: Split) -> list[Task]:
        """The tasks of one split; deterministic for a given seed and sizes; splits disjoint."""

    @abstractmethod
    def make_env(self, task: Task) -> Env: ...

    @abstractmethod
    def normalise_action(self, raw: Any) -> Action:
        """Turn parse_action's return value (str, dict or None) into an Action."""

    def close(self) -> None:
        """Release resources (servers, subprocesses); nothing by default."""
        return None
