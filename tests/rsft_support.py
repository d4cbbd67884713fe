"""Shared pieces of the RSFT tests: a small real domain a random model can score on, and configs.

A random tiny model never solves a math problem, so every math rollout is rejected and RSFT never
updates. `ParityDomain` is a genuine domain with a verifier a random model passes about half the
time (the reply has an even number of characters), so accepted rollouts, updates and on-policy
effects can be observed in seconds. Run as a script it trains until killed (the SIGKILL test).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from whale_lab.config import Config, config_from_dict
from whale_lab.context import RunContext
from whale_lab.domains.base import SPLITS, Action, Domain, Env, Split, StepOutcome, Task

HARNESS = 'USER_PROMPT = "{question}"\nMAX_TURNS = 1\n'


class ParityEnv(Env):
    def __init__(self, task: Task, retry: bool = False) -> None:
        self.task = task
        self.retry = retry

    def initial_observation(self) -> Any:
        return None

    def context(self) -> dict[str, Any]:
        return {}

    def step(self, action: Action) -> StepOutcome:
        even = len(action.value) % 2 == 0
        if self.retry and not even:  # one more turn, with the verdict as the observation
            self.retry = False
            return StepOutcome(observation="odd, try again")
        return StepOutcome(done=True, reward=1.0 if even else 0.0, stop_reason="answered")


class ParityDomain(Domain):
    """Tasks "say <split> <i>"; the reply is right when its stripped text has an even length.

    With `retry`, an odd reply gets one more turn (episodes of one or two turns).
    """

    name = "parity"

    def __init__(self, sizes: dict[str, int] | None = None, retry: bool = False) -> None:
        self.retry = retry
        sizes = sizes or {"weight": 8, "harness": 2, "val": 2, "test": 2}
        self._splits = {
            s: [
                Task(id=f"{s}-{i}", domain="parity", fields={"question": f"say {s} {i}"}, answer=0)
                for i in range(sizes[s])
            ]
            for s in SPLITS
        }

    def tasks(self, split: Split) -> list[Task]:
        return list(self._splits[split])

    def make_env(self, task: Task) -> ParityEnv:
        return ParityEnv(task, self.retry)

    def normalise_action(self, raw: Any) -> Action:
        text = raw if isinstance(raw, str) else ""
        return Action(kind="answer", value=text.strip())


def write_harness(folder: Path, max_turns: int = 1) -> Path:
    path = Path(folder) / "parity_h0.py"
    path.write_text(HARNESS.replace("MAX_TURNS = 1", f"MAX_TURNS = {max_turns}"), encoding="utf-8")
    return path


def tiny_config(**sections: dict[str, Any]) -> Config:
    """A config for seconds-long runs on the tiny random model; `sections` override per table."""
    data: dict[str, Any] = {
        "model": {"path": "tiny-random", "lora": {"rank": 8, "alpha": 16.0}},
        "domain": {"splits": {"weight": 8, "harness": 2, "val": 2, "test": 2}},
        "sampling": {"max_new_tokens": 6, "k": 2, "batch_size": 64},
        "rsft": {
            "prompts_per_step": 2,
            "samples_per_prompt": 4,
            "minibatch_size": 4,
            "learning_rate": 0.05,
            "eval_every": 10.0,
        },
        # equal weight phases, as the engine tests count them (the shipped default shortens the
        # first one for the app: tests/test_schedules.py)
        "schedule": {"first_weight_epochs": 0.0},
    }
    for name, values in sections.items():
        table = data.setdefault(name, {})
        for key, value in values.items():
            if isinstance(value, dict):
                table.setdefault(key, {}).update(value)
            else:
                table[key] = value
    return config_from_dict(data)


def _train_until_killed(run_dir: str) -> None:
    """Train forever-ish, printing each completed step (the parent kills this process)."""
    from whale_lab.backends import make_backend
    from whale_lab.store import RunStore
    from whale_lab.weights.rsft import RsftPhase

    cfg = tiny_config()
    store = RunStore(run_dir)
    phase = RsftPhase(RunContext.of(cfg, make_backend(cfg), ParityDomain(), store))

    def emit(event: Any) -> None:
        store.emit(event)
        if event.type == "weight_step":
            print(f"step {event.step}", flush=True)

    phase.emit = emit
    phase.run(write_harness(Path(run_dir)), epochs=100.0)


if __name__ == "__main__":
    _train_until_killed(sys.argv[1])
