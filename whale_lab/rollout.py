"""Batched multi-turn episodes: every live episode advances together.

Per turn there is one round trip per harness host to render prompts, one batched generation over
every live episode, and one round trip per host to parse the replies. Episodes that end drop out;
the rest go on. The environment (tools, verifier) runs here, in the engine process; harness code
never sees answers.

Jobs may belong to several arms (harness hosts, sampling seeds, sinks) of a paired comparison:
their episodes then share the generation calls turn by turn, so drift in the backend lands on
every arm. Each episode's prompt carries its own sampling seed, a stable hash of (the arm's seed,
task id, sample index, turn): the same task, sample and turn draw the same random stream in every
arm whatever else is in the call, so two arms that render the same prompt get the same completion.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from whale_lab.backends.base import Backend, Generation, Prompt, SamplingParams, encode_with
from whale_lab.domains.base import Action, Domain, Env, StepOutcome, Task
from whale_lab.trace import EpisodeTrace, TurnRecord

OnEpisode = Callable[[EpisodeTrace], None]


@dataclass(frozen=True)
class Job:
    """One episode to run; a plain `(task, sample)` pair is a Job of the call's one arm.

    `arm` tells arms apart: a (task, sample) repeated within one arm gets other seeds, the same
    (task, sample) in two arms the same ones. `host`, `seed` and `on_episode` default to the
    call's harness, `params.seed` and `on_episode`.
    """

    task: Task
    sample: int
    arm: int = 0
    host: Any = None
    seed: int | None = None
    on_episode: OnEpisode | None = None


def episode_seed(seed: int, task_id: str, sample: int, turn: int, repeat: int = 0) -> int:
    """The sampling seed of one episode's turn: a stable hash (not Python's salted `hash`), in
    31 bits so that every backend and server takes it as a request seed."""
    key = f"{seed}:{task_id}:{sample}:{turn}" + (f":{repeat}" if repeat else "")
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31 - 1)


@dataclass
class _Arm:
    """What one arm's episodes share: host, seed, sink, and the harness's budgets and stops."""

    host: Any
    seed: int | None
    on_episode: OnEpisode | None
    params: SamplingParams  # the call's, with the harness's stop sequences
    max_turns: int
    format_budget: int
    illegal_budget: int
    name: str


@dataclass
class _Live:
    """Engine-side state of one running episode."""

    task: Task
    env: Env
    trace: EpisodeTrace
    arm: _Arm
    sample: int = 0
    repeat: int = 0  # earlier jobs of the same arm with the same (task, sample)
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


def _arms(
    jobs: Sequence[tuple[Task, int] | Job],
    harness: Any,
    params: SamplingParams,
    on_episode: OnEpisode | None,
) -> list[tuple[Job, _Arm]]:
    """Each job as a Job with its arm; a host's info is read once, whatever arms share it."""
    infos: dict[int, tuple[Any, SamplingParams]] = {}
    arms: dict[tuple[int, int, int | None, int], _Arm] = {}
    out: list[tuple[Job, _Arm]] = []
    for raw in jobs:
        job = raw if isinstance(raw, Job) else Job(raw[0], raw[1])
        host = job.host if job.host is not None else harness
        if host is None:
            raise ValueError("run_episodes: a job has no harness host (pass `harness`)")
        if id(host) not in infos:
            info = host.info
            stop = tuple(getattr(info, "stop_sequences", ()) or ()) or params.stop
            own = params if stop == params.stop else dataclasses.replace(params, stop=stop)
            infos[id(host)] = (info, own)
        info, host_params = infos[id(host)]
        seed = job.seed if job.seed is not None else params.seed
        sink = job.on_episode if job.on_episode is not None else on_episode
        key = (job.arm, id(host), seed, id(sink))
        if key not in arms:
            arms[key] = _Arm(
                host=host,
                seed=seed,
                on_episode=sink,
                params=host_params,
                max_turns=int(info.max_turns),
                format_budget=int(info.format_retry_budget),
                illegal_budget=int(info.illegal_move_retry_budget),
                name=info.name,
            )
        out.append((job, arms[key]))
    return out


def _call_hosts(
    items: Sequence[Any], host_of: Callable[[Any], Any], method: str, requests: Sequence[Any]
) -> list[Any]:
    """`host.render` / `host.parse`, one round trip per host over its items; results in order."""
    groups: dict[int, tuple[Any, list[int]]] = {}
    for i, item in enumerate(items):
        host = host_of(item)
        groups.setdefault(id(host), (host, []))[1].append(i)
    results: list[Any] = [None] * len(items)
    for host, where in groups.values():
        got = getattr(host, method)([requests[i] for i in where])
        for i, res in zip(where, got, strict=True):
            results[i] = res
    return results


def _generate(
    backend: Backend, prompts: list[Any], params: list[SamplingParams]
) -> list[Generation]:
    """One `generate` per distinct params (hosts' stop sequences), in first-seen order; results
    in prompt order. Arms whose harnesses stop alike share one call."""
    groups: dict[SamplingParams, list[int]] = {}
    for i, p in enumerate(params):
        groups.setdefault(p, []).append(i)
    out: list[Any] = [None] * len(prompts)
    for p, where in groups.items():
        gens = backend.generate([prompts[i] for i in where], p)
        for i, g in zip(where, gens, strict=True):
            out[i] = g
    return out


def run_episodes(
    jobs: Sequence[tuple[Task, int] | Job],
    domain: Domain,
    harness: Any,
    backend: Backend,
    params: SamplingParams,
    *,
    max_context_tokens: int = 2048,
    on_episode: OnEpisode | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[EpisodeTrace]:
    """Run (task, sample) episodes to completion; traces in job order.

    `harness` is a started `whale_lab.harness.HarnessHost`, the host of every job that names
    none. A `Job` may name its own host, seed and sink: the arms of a paired comparison then run
    in one call, with one render and one parse round trip per host per turn and one generation
    per turn over every arm's episodes (split only where hosts' stop sequences differ). With a
    seed (`params.seed` or the job's), each prompt carries its own `episode_seed`. If
    `should_stop` turns true between turns, unfinished episodes are dropped (their traces are
    not returned).
    """
    episodes: list[_Live] = []
    seen: dict[tuple[int, str, int], int] = {}
    for job, arm in _arms(jobs, harness, params, on_episode):
        task = job.task
        env = domain.make_env(task)
        trace = EpisodeTrace(
            task_id=task.id, domain=task.domain, sample=job.sample, harness=arm.name
        )
        key = (job.arm, str(task.id), job.sample)
        repeat = seen.get(key, 0)
        seen[key] = repeat + 1
        ep = _Live(task=task, env=env, trace=trace, arm=arm, sample=job.sample, repeat=repeat)
        ep.history.append(
            {"type": "observation", "observation": _json_safe(env.initial_observation())}
        )
        episodes.append(ep)

    def close(ep: _Live) -> None:
        ep.trace.info.update(_json_safe(ep.env.final_info()))
        if ep.arm.on_episode is not None:
            ep.arm.on_episode(ep.trace)

    # A backend that only counts tokens (a test's scripted one) is given the chats.
    native = callable(getattr(backend, "encode", None))
    turn = 0
    while True:
        live = [ep for ep in episodes if not ep.done]
        if not live:
            break
        if should_stop is not None and should_stop():
            return [ep.trace for ep in episodes if ep.done]
        turn += 1

        # 1. render prompts (one round trip per host)
        contexts = [_context(ep, turn, ep.arm.max_turns) for ep in live]
        rendered = _call_hosts(
            live,
            lambda ep: ep.arm.host,
            "render",
            [
                {"fields": dict(ep.task.fields), "history": ep.history, "context": ctx}
                for ep, ctx in zip(live, contexts, strict=True)
            ],
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
            if prompt.tokens + ep.arm.params.max_new_tokens > max_context_tokens:
                ep.finish("token_cap", error="prompt no longer fits the model's context")
                close(ep)
                continue
            if ep.arm.seed is not None:  # this episode's turn, wherever it sits in the call
                turn_no = len(ep.trace.turns) + 1
                seed = episode_seed(ep.arm.seed, str(ep.task.id), ep.sample, turn_no, ep.repeat)
                prompt = dataclasses.replace(prompt, seed=seed)
            ready.append((ep, messages, ctx))
            prompts.append(prompt)
        if not ready:
            continue

        # 2. one batched generation over every live episode, of every arm
        gens: list[Generation] = _generate(
            backend,
            [p if native else m for p, (_, m, _) in zip(prompts, ready, strict=True)],
            [ep.arm.params for ep, _, _ in ready],
        )

        # 3. parse replies (one round trip per host)
        parsed = _call_hosts(
            ready,
            lambda r: r[0].arm.host,
            "parse",
            [
                {"response": g.text, "context": ctx}
                for (_, _, ctx), g in zip(ready, gens, strict=True)
            ],
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
                if ep.trace.format_failures > ep.arm.format_budget:
                    ep.finish("format_failure")
                    close(ep)
                    continue
                ep.history.append({"type": "feedback", "kind": "format", "detail": shown})
                if refused is None:
                    rec.feedback = {"kind": "format", "detail": action.reason}
                _check_turn_cap(ep, close)
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
                    if ep.trace.illegal_moves > ep.arm.illegal_budget:
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
            _check_turn_cap(ep, close)
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


def _check_turn_cap(ep: _Live, close: Callable[[_Live], None]) -> None:
    if not ep.done and len(ep.trace.turns) >= ep.arm.max_turns:
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
