"""One pre-training episode: the transcript records and the loop that plays them under a harness.

The loop mirrors `rollout.run_episodes` (budgets, turn cap, feedback turns) so the dialogues the
micro model pre-trains on look exactly like the ones it later meets; the domain modules only
supply tasks, environments and reference policies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from whale_lab.domains.base import Action, Env, Task
from whale_lab.micro.styles import Style


@dataclass
class Turn:
    """What the model saw on one turn and what it should say."""

    messages: list[dict[str, str]]
    response: str


@dataclass
class Transcript:
    domain: str
    task_id: str
    style: str
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    stop_reason: str = ""

    def final_messages(self) -> list[dict[str, str]]:
        """The whole dialogue: the last prompt plus the last reply."""
        last = self.turns[-1]
        return [*last.messages, {"role": "assistant", "content": last.response}]

    def to_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "task_id": self.task_id,
            "style": self.style,
            "reward": self.reward,
            "stop_reason": self.stop_reason,
            "turns": [{"messages": t.messages, "response": t.response} for t in self.turns],
        }


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


class Policy:
    """Writes the assistant's reply for the current turn."""

    def respond(self, messages: list[dict[str, str]], history: list[dict[str, Any]]) -> str:
        raise NotImplementedError


def run_episode(
    task: Task,
    env: Env,
    normalise: Callable[[Any], Action],
    runtime: Any,
    style: Style,
    policy: Policy,
) -> Transcript:
    """One episode under one harness with the same budgets and caps as `rollout.run_episodes`."""
    info = runtime.info()
    max_turns = int(info["max_turns"])
    format_budget = int(info["format_retry_budget"])
    illegal_budget = int(info["illegal_move_retry_budget"])
    history: list[dict[str, Any]] = [
        {"type": "observation", "observation": _json_safe(env.initial_observation())}
    ]
    out = Transcript(domain=task.domain, task_id=task.id, style=style.name)
    format_failures = illegal = 0
    for turn in range(1, max_turns + 1):
        ctx = dict(env.context())
        ctx.setdefault("turn_count", turn)
        ctx["max_turns"] = max_turns
        messages = runtime.render(dict(task.fields), history, ctx)
        response = policy.respond(messages, history)
        out.turns.append(Turn(messages=messages, response=response))
        action = normalise(runtime.parse(response, ctx))
        history.append({"type": "response", "text": response})
        if action.kind == "invalid":
            format_failures += 1
            if format_failures > format_budget:
                out.stop_reason = "format_failure"
                return out
            history.append({"type": "feedback", "kind": "format", "detail": action.reason})
            continue
        outcome = env.step(action)
        if outcome.done:
            out.reward = float(outcome.reward)
            out.stop_reason = outcome.stop_reason or "answered"
            return out
        if outcome.feedback_kind is not None:
            if outcome.feedback_kind == "illegal":
                illegal += 1
                if illegal > illegal_budget:
                    out.stop_reason = "illegal_moves"
                    return out
            history.append(
                {
                    "type": "feedback",
                    "kind": outcome.feedback_kind,
                    "detail": outcome.feedback_detail,
                }
            )
        else:
            history.append({"type": "observation", "observation": _json_safe(outcome.observation)})
    out.stop_reason = "turn_cap"
    return out


def load_runtime(style: Style) -> Any:
    """The harness runtime (the code the host runs) for a style, loaded in this process."""
    from whale_lab.harness.chess_contract import CHESS_ALLOWED_IMPORTS
    from whale_lab.harness.runtime import HarnessRuntime
    from whale_lab.harness.surfaces import ALLOWED_IMPORTS

    allowed = CHESS_ALLOWED_IMPORTS if style.domain == "chess" else ALLOWED_IMPORTS
    return HarnessRuntime(
        style.source, f"<style {style.name}>", domain=style.domain, allowed_imports=allowed
    )


class RuntimeCache:
    """Styles repeat (h0 above all): load each distinct source once."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def get(self, style: Style) -> Any:
        rt = self._cache.get(style.source)
        if rt is None:
            rt = load_runtime(style)
            self._cache[style.source] = rt
        return rt
