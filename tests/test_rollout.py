"""The batched rollout loop: budgets, turn caps, harness failures, and one generation per turn.

A scripted backend replays fixed replies so that the loop's bookkeeping can be checked exactly; the
real model is exercised in test_rollout_model.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from whale_lab.backends.base import Generation, Message, SamplingParams
from whale_lab.domains.base import Action, Domain, Env, StepOutcome, Task
from whale_lab.harness import HarnessHost
from whale_lab.rollout import run_episodes


class ScriptedBackend:
    """Replies by looking up the last user message; counts batched calls."""

    name = "scripted"

    def __init__(self, replies: dict[str, list[str]]) -> None:
        self.replies = {k: list(v) for k, v in replies.items()}
        self.calls: list[int] = []

    def generate(
        self, prompts: Sequence[Sequence[Message]], params: SamplingParams
    ) -> list[Generation]:
        self.calls.append(len(prompts))
        out = []
        for msgs in prompts:
            first_user = next(m["content"] for m in msgs if m["role"] == "user")
            key = first_user.split("\n")[0]
            text = self.replies[key].pop(0) if self.replies[key] else ""
            out.append(
                Generation(
                    text=text,
                    prompt_tokens=10,
                    completion_tokens=len(text.split()),
                    finish_reason="stop",
                )
            )
        return out

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return sum(len(m["content"].split()) for m in messages)

    def close(self) -> None:
        pass


class CounterEnv(Env):
    """Answer with the number; `look` is a tool that reveals it; `bad` is illegal."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def initial_observation(self) -> Any:
        return None

    def context(self) -> dict[str, Any]:
        return {"side": "white"}

    def step(self, action: Action) -> StepOutcome:
        if action.kind == "answer":
            ok = action.value.strip() == str(self.task.answer)
            return StepOutcome(done=True, reward=float(ok), stop_reason="answered")
        if action.kind == "tool":
            return StepOutcome(
                observation={"secret": self.task.answer}, tool_error=action.tool != "look"
            )
        return StepOutcome(feedback_kind="illegal", feedback_detail=f"{action.value} is illegal")


class CounterDomain(Domain):
    name = "counter"

    def tasks(self, split: str) -> list[Task]:  # type: ignore[override]
        return [
            Task(id=f"t{i}", domain="counter", fields={"question": f"q{i}"}, answer=i)
            for i in range(3)
        ]

    def make_env(self, task: Task) -> Env:
        return CounterEnv(task)

    def normalise_action(self, raw: Any) -> Action:
        if raw is None:
            return Action(kind="invalid", reason="no action found")
        if isinstance(raw, dict) and raw.get("type") == "tool":
            return Action(kind="tool", tool=raw["name"], args=raw.get("arguments", {}))
        if isinstance(raw, dict) and raw.get("type") == "move":
            return Action(kind="move", value=raw["move"])
        return Action(kind="answer", value=str(raw))


HARNESS = """
USER_PROMPT = "{question}\\nsay ANSWER <n>, LOOK, or MOVE <m>"
MAX_TURNS = 3
FORMAT_RETRY_BUDGET = 1
ILLEGAL_MOVE_RETRY_BUDGET = 0

def format_observation(observation, **context):
    if observation is None:
        return ""
    return "secret=" + str(observation["secret"])

def parse_action(response):
    if response.startswith("ANSWER "):
        return response[7:]
    if response == "LOOK":
        return {"type": "tool", "name": "look", "arguments": {}}
    if response.startswith("MOVE "):
        return {"type": "move", "move": response[5:]}
    if response == "CRASH":
        raise RuntimeError("parser exploded")
    return None
"""


@pytest.fixture()
def host(tmp_path: Path):
    path = tmp_path / "counter_h.py"
    path.write_text(HARNESS)
    h = HarnessHost(path, "counter")
    yield h
    h.close()


def _run(host: HarnessHost, replies: dict[str, list[str]]) -> tuple[list, ScriptedBackend]:
    domain = CounterDomain()
    backend = ScriptedBackend(replies)
    tasks = domain.tasks("val")
    traces = run_episodes([(t, 0) for t in tasks], domain, host, backend, SamplingParams())
    return traces, backend


def test_episodes_advance_together_with_one_generation_per_turn(host: HarnessHost) -> None:
    traces, backend = _run(
        host, {"q0": ["ANSWER 0"], "q1": ["LOOK", "ANSWER 1"], "q2": ["LOOK", "LOOK", "LOOK"]}
    )
    # turn 1: 3 live, turn 2: 2 live, turn 3: 1 live -> exactly one batched call per turn
    assert backend.calls == [3, 2, 1]
    t0, t1, t2 = traces
    assert (t0.stop_reason, t0.reward, t0.n_turns) == ("answered", 1.0, 1)
    assert (t1.stop_reason, t1.reward, t1.tool_calls) == ("answered", 1.0, 1)
    assert t2.stop_reason == "turn_cap" and t2.n_turns == 3
    # the observation reached the model through format_observation, as a user turn
    second_prompt = t1.turns[1].prompt
    assert [m["role"] for m in second_prompt] == ["user", "assistant", "user"]
    assert second_prompt[-1]["content"] == "secret=1"


def test_format_budget_and_illegal_budget(host: HarnessHost) -> None:
    traces, _ = _run(host, {"q0": ["???", "ANSWER 0"], "q1": ["???", "???"], "q2": ["MOVE x"]})
    t0, t1, t2 = traces
    assert t0.stop_reason == "answered" and t0.format_failures == 1
    assert t0.turns[0].feedback["kind"] == "format"
    assert t1.stop_reason == "format_failure" and t1.format_failures == 2
    assert t2.stop_reason == "illegal_moves" and t2.illegal_moves == 1  # budget 0


def test_harness_crash_costs_only_its_episode(host: HarnessHost) -> None:
    traces, _ = _run(host, {"q0": ["CRASH"], "q1": ["ANSWER 1"], "q2": ["ANSWER 7"]})
    assert traces[0].stop_reason == "harness_error"
    assert "parser exploded" in traces[0].error
    assert (traces[1].reward, traces[2].reward) == (1.0, 0.0)


def test_context_overflow_ends_with_token_cap(host: HarnessHost) -> None:
    domain = CounterDomain()
    backend = ScriptedBackend({"q0": ["LOOK"] * 3})
    traces = run_episodes(
        [(domain.tasks("val")[0], 0)],
        domain,
        host,
        backend,
        SamplingParams(max_new_tokens=10),
        max_context_tokens=12,
    )
    assert traces[0].stop_reason == "token_cap"
    assert backend.calls == []


def test_should_stop_drops_unfinished_episodes(host: HarnessHost) -> None:
    domain = CounterDomain()
    backend = ScriptedBackend(
        {"q0": ["ANSWER 0"], "q1": ["LOOK", "ANSWER 1"], "q2": ["LOOK", "LOOK"]}
    )
    turns = {"n": 0}

    def should_stop() -> bool:
        turns["n"] += 1
        return turns["n"] > 1

    traces = run_episodes(
        [(t, 0) for t in domain.tasks("val")],
        domain,
        host,
        backend,
        SamplingParams(),
        should_stop=should_stop,
    )
    assert [t.task_id for t in traces] == ["t0"]


class CountingTokenizer:
    """A tokenizer that counts chat renders and encodings (everything else passes through)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.renders = 0
        self.encodings = 0

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        self.renders += 1
        return self._inner.apply_chat_template(*args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.encodings += 1
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_each_prompt_is_rendered_and_tokenised_once_per_turn(
    host: HarnessHost, tiny_model_dir: Path
) -> None:
    from whale_lab.backends.hf import HFBackend
    from whale_lab.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    counting = CountingTokenizer(tok)
    backend = HFBackend(model, counting, batch_size=4, max_context_tokens=512)
    domain = CounterDomain()
    traces = run_episodes(
        [(t, s) for t in domain.tasks("val") for s in range(2)],
        domain,
        host,
        backend,
        SamplingParams(max_new_tokens=6, seed=1),
    )
    turns = sum(t.n_turns for t in traces)
    assert turns > len(traces)  # random replies fail to parse: a second turn for most episodes
    assert counting.renders == counting.encodings == turns
    # A Prompt from another encoding (other template settings) is encoded again, not trusted.
    messages = traces[0].turns[0].prompt
    other = HFBackend(model, tok, chat_template_kwargs={"flavour": "x"})
    prompt = other.encode(messages)
    params = SamplingParams(temperature=0.0, max_new_tokens=4)
    before = counting.renders
    assert backend.generate([prompt], params) == backend.generate([messages], params)
    assert counting.renders == before + 2
    assert backend.generate([backend.encode(messages)], params)[0].prompt_tokens == prompt.tokens
