"""Batched multi-turn episodes: every live episode advances together.

Per turn there is one harness-host round trip to render prompts, one batched generation over every
live episode, and one round trip to parse the replies. Episodes that end drop out; the rest go on.
The environment (tools, verifier) runs here, in the engine process; harness code never sees answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from whale_lab.backends.base import Backend, Generation, Prompt, SamplingParams, encode_with
from whale_lab.domains.base import Action, Domain, Env, StepOutcome, Task
from whale_lab.trace import EpisodeTrace, TurnRecord


@dataclass
class _Live:
    """Engine-side state of one running episode."""

    task: Task
    env: Env
    trace: EpisodeTrace
    history: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False

    def finish(self, reason: str, reward: float = 0.0, error: str = "") -> None:
        self.done = True
        self.trace.stop_reason = reason
        self.trace.reward = reward
        if error:
            self.trace.error = error


def _context(ep: _Live, turn: int, max_turns: int) -> dict[str, Any]:
    ctx = dict(ep.env.context())
    ctx.setdefault("turn_count", turn)
    ctx["max_turns"] = max_turns
    return ctx


def _json_safe(obj: Any) -> Any:
    """Observations cross a process boundary and land in JSONL: keep them plain."""
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return str(obj)


def run_episodes(
    jobs: Sequence[tuple[Task, int]],
    domain: Domain,
    harness: Any,
    backend: Backend,
    params: SamplingParams,
    *,
    max_context_tokens: int = 2048,
    on_episode: Callable[[EpisodeTrace], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[EpisodeTrace]:
    """Run (task, sample) episodes to completion under one harness; traces in job order.

    `harness` is a started `whale_lab.harness.HarnessHost`. If `should_stop` turns true between
    turns, unfinished episodes are dropped (their traces are not returned).
    """
    info = harness.info
    max_turns = int(info.max_turns)
    format_budget = int(info.format_retry_budget)
    illegal_budget = int(info.illegal_move_retry_budget)
    stop = tuple(getattr(info, "stop_sequences", ()) or ()) or params.stop
    if stop != params.stop:
        params = SamplingParams(**{**params.__dict__, "stop": stop})

    episodes: list[_Live] = []
    for task, sample in jobs:
        env = domain.make_env(task)
        trace = EpisodeTrace(task_id=task.id, domain=task.domain, sample=sample, harness=info.name)
        ep = _Live(task=task, env=env, trace=trace)
        ep.history.append(
            {"type": "observation", "observation": _json_safe(env.initial_observation())}
        )
        episodes.append(ep)

    def close(ep: _Live) -> None:
        ep.trace.info.update(_json_safe(ep.env.final_info()))
        if on_episode is not None:
            on_episode(ep.trace)

    turn = 0
    while True:
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        if should_stop is not None and should_stop():
            return [ep.trace for ep in episodes if ep.done]
        turn += 1

        # 1. render prompts (one round trip)
        contexts = [_context(ep, turn, max_turns) for ep in live]
        rendered = harness.render(
            [
                {"fields": dict(ep.task.fields), "history": ep.history, "context": ctx}
                for ep, ctx in zip(live, contexts, strict=True)
            ]
        )
        ready: list[tuple[_Live, list[dict[str, str]], dict[str, Any]]] = []
        prompts: list[Prompt] = []  # each rendered and tokenised once, for the check and generate
        for ep, res, ctx in zip(live, rendered, contexts, strict=True):
            if not res.ok:
                ep.finish("harness_error", error=f"render: {res.kind}: {res.error}")
                close(ep)
                continue
            messages = res.value
            prompt = encode_with(backend, messages)
            if prompt.tokens + params.max_new_tokens > max_context_tokens:
                ep.finish("token_cap", error="prompt no longer fits the model's context")
                close(ep)
                continue
            ready.append((ep, messages, ctx))
            prompts.append(prompt)
        if not ready:
            continue

        # 2. one batched generation over every live episode
        # (a backend that only counts tokens, a test's scripted one, is given the chats)
        native = callable(getattr(backend, "encode", None))
        gens: list[Generation] = backend.generate(
            prompts if native else [m for _, m, _ in ready], params
        )

        # 3. parse replies (one round trip)
        parsed = harness.parse(
            [
                {"response": g.text, "context": ctx}
                for (_, _, ctx), g in zip(ready, gens, strict=True)
            ]
        )

        # 4. environment transitions, engine-side
        stepping: list[tuple[_Live, TurnRecord, Action]] = []
        for (ep, messages, _ctx), gen, res in zip(ready, gens, parsed, strict=True):
            rec = TurnRecord(
                prompt=messages,
                response=gen.text,
                finish_reason=gen.finish_reason,
                prompt_tokens=gen.prompt_tokens,
                completion_tokens=gen.completion_tokens,
                token_ids=_sampled_ids(gen),
            )
            ep.trace.turns.append(rec)
            if gen.finish_reason == "length":
                ep.trace.token_cap_hits += 1
            if gen.finish_reason == "error":
                ep.finish("backend_error", error=gen.error or "generation failed")
                close(ep)
                continue
            if not res.ok:
                ep.finish("harness_error", error=f"parse_action: {res.kind}: {res.error}")
                close(ep)
                continue
            action: Action = domain.normalise_action(res.value)
            refused = _refusal(ep.env, action, gen.text)
            shown = action.reason
            if refused is not None:  # the parser, not the model, chose: a format failure
                kind, reason, shown = refused
                action = Action(kind="invalid", value=action.value, reason=reason)
                rec.feedback = {"kind": kind, "detail": reason}  # every such turn, the last too
            rec.action = action.to_dict()
            ep.history.append({"type": "response", "text": gen.text})
            if action.kind == "invalid":
                ep.trace.format_failures += 1
                if ep.trace.format_failures > format_budget:
                    ep.finish("format_failure")
                    close(ep)
                    continue
                ep.history.append({"type": "feedback", "kind": "format", "detail": shown})
                if refused is None:
                    rec.feedback = {"kind": "format", "detail": action.reason}
                _check_turn_cap(ep, max_turns, close)
            else:
                if action.kind == "tool":
                    ep.trace.tool_calls += 1
                stepping.append((ep, rec, action))

        # Tools (a python subprocess, a retrieval request) run concurrently across episodes.
        outcomes = _step_all([(ep.env, action) for ep, _, action in stepping])
        for (ep, rec, _action), outcome in zip(stepping, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            if outcome.tool_error:
                ep.trace.tool_errors += 1
            if outcome.done:
                rec.observation = _json_safe(outcome.observation)
                ep.finish(outcome.stop_reason or "answered", reward=float(outcome.reward))
                close(ep)
                continue
            if outcome.feedback_kind is not None:
                kind = outcome.feedback_kind
                if kind == "illegal":
                    ep.trace.illegal_moves += 1
                    if ep.trace.illegal_moves > illegal_budget:
                        ep.finish("illegal_moves")
                        close(ep)
                        continue
                ep.history.append(
                    {"type": "feedback", "kind": kind, "detail": outcome.feedback_detail}
                )
                rec.feedback = {"kind": kind, "detail": outcome.feedback_detail}
            else:
                obs = _json_safe(outcome.observation)
                rec.observation = obs
                ep.history.append({"type": "observation", "observation": obs})
            _check_turn_cap(ep, max_turns, close)
    return [ep.trace for ep in episodes]


def _sampled_ids(gen: Generation) -> list[int] | None:
    """The ids to train on; None when the backend returned none (SFT re-encodes the text then).

    An empty completion has no ids to return, so `()` with zero tokens is a real, empty answer.
    """
    if gen.finish_reason == "error":
        return None
    if gen.token_ids or gen.completion_tokens == 0:
        return [int(t) for t in gen.token_ids]
    return None


def _refusal(env: Env, action: Action, response: str) -> tuple[str, str, str] | None:
    """The environment's refusal of a parsed action that the model's reply does not back.

    An environment may define `check_reply(action, response)`; chess does, so that a parser
    cannot choose the move itself. It returns None, or (feedback kind for the trace, reason for
    the trace, detail shown to the model). Checked here, on the model's raw reply, because the
    environment only ever receives the parsed action.
    """
    check = getattr(env, "check_reply", None)
    if action.kind == "invalid" or not callable(check):
        return None
    return check(action, response)


def _check_turn_cap(ep: _Live, max_turns: int, close: Callable[[_Live], None]) -> None:
    if not ep.done and len(ep.trace.turns) >= max_turns:
        ep.finish("turn_cap")
        close(ep)


_POOL: ThreadPoolExecutor | None = None


def _step_all(pairs: list[tuple[Env, Action]]) -> list[StepOutcome | BaseException]:
    """Step every environment; in threads when there are several, since tools mostly wait."""
    global _POOL
    if len(pairs) <= 1:
        return [_safe_step(env, action) for env, action in pairs]
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="whale-env")
    return list(_POOL.map(lambda p: _safe_step(*p), pairs))


def _safe_step(env: Env, action: Action) -> StepOutcome | BaseException:
    try:
        return env.step(action)
    except BaseException as exc:  # re-raised in the caller's thread, in episode order
        return exc
