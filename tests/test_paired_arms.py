"""Paired comparisons at the sampling level: per-episode seeds and interleaved arms.

Each episode's prompt carries a seed from (the arm's seed, task, sample, turn), so an episode's
sample depends neither on what else is in the generation call nor on the turn other episodes are
on, and two arms that render the same prompt get the same completion. `Evaluator.score_arms`
runs the arms of a comparison in the same waves and generation calls and scores each arm exactly
as scoring it alone does (checked on the hf backend, greedy and seeded sampling).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from servers import FaultServer, echo_responder
from test_rollout import CounterDomain

from whale_lab.backends.base import Generation, Prompt, PromptLike, SamplingParams
from whale_lab.backends.hf import HFBackend
from whale_lab.config import SandboxConfig
from whale_lab.context import Arm, EpisodeSink, Evaluator
from whale_lab.events import ActivityProgress, EpisodeFinished, Event
from whale_lab.harness import HarnessHost
from whale_lab.models import load_model_and_tokenizer
from whale_lab.rollout import Job, episode_seed, run_episodes

SAMPLED = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=6, seed=21)
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6, seed=21)

# Random replies of the tiny model parse into an answer, a tool call or nothing (a format
# failure) by their characters, so episodes end at different turns. `SHIFT` changes the parser
# only: harnesses that differ in it render the same prompts.
HARNESS = """
USER_PROMPT = "{question}\\nsay something"
MAX_TURNS = 4
FORMAT_RETRY_BUDGET = 3
ILLEGAL_MOVE_RETRY_BUDGET = 3
SHIFT = %d

def format_observation(observation, **context):
    return "" if observation is None else "secret=" + str(observation["secret"])

def parse_action(response):
    h = (sum(ord(c) for c in response) + SHIFT) %% 3
    if h == 0:
        return "0"
    if h == 1:
        return {"type": "tool", "name": "look", "arguments": {}}
    return None
"""

OTHER_PROMPT = HARNESS.replace("say something", "answer now")


class Recording:
    """The hf backend, recording each generate call's prompts."""

    def __init__(self, inner: HFBackend) -> None:
        self.inner = inner
        self.calls: list[list[PromptLike]] = []

    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        self.calls.append(list(prompts))
        return self.inner.generate(prompts, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFBackend:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    return HFBackend(model, tok, batch_size=8, max_context_tokens=512)


@pytest.fixture()
def harnesses(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, code in (("a", HARNESS % 0), ("b", HARNESS % 1), ("c", OTHER_PROMPT % 0)):
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        out[name] = path
    return out


def _turns(trace: Any) -> list[tuple[str, tuple[int, ...] | None]]:
    return [(t.response, tuple(t.token_ids or ())) for t in trace.turns]


# ---------------------------------------------------------------- the seed


def test_the_episode_seed_is_a_stable_hash_of_its_parts() -> None:
    s = episode_seed(21, "t0", 0, 1)
    assert s == episode_seed(21, "t0", 0, 1, 0) == 2084306002  # the same in every process
    others = {
        episode_seed(22, "t0", 0, 1),
        episode_seed(21, "t1", 0, 1),
        episode_seed(21, "t0", 1, 1),
        episode_seed(21, "t0", 0, 2),
        episode_seed(21, "t0", 0, 1, 1),
    }
    assert s not in others and len(others) == 5
    assert all(0 <= x < 2**31 - 1 for x in others)


# ---------------------------------------------------------------- backends honour Prompt.seed


def test_a_prompt_seed_fixes_its_sample_on_both_hf_paths(hf: HFBackend) -> None:
    chats = [[{"role": "user", "content": f"question {i} " * (i + 1)}] for i in range(5)]
    prompts = [dataclasses.replace(hf.encode(c), seed=1000 + i) for i, c in enumerate(chats)]
    params = dataclasses.replace(SAMPLED, max_new_tokens=10)
    a = hf.generate(prompts, params)
    # another order, other company, another call seed: the same samples
    shuffled = [prompts[3], hf.encode([{"role": "user", "content": "zzz"}]), prompts[0]]
    b = hf.generate(shuffled, dataclasses.replace(params, seed=99))
    assert [b[0], b[2]] == [a[3], a[0]]
    # the padded path draws each seeded row from the same stream
    padded = HFBackend(
        hf.model, hf.tokenizer, batch_size=2, max_context_tokens=512, continuous=False
    )
    assert padded.generate(prompts, params) == a
    assert padded.generate(prompts[::-1], params) == a[::-1]
    # the same prompt under two seeds: two samples; without a seed: the call's seed, as before
    twice = hf.generate([prompts[0], dataclasses.replace(prompts[0], seed=7)], params)
    assert twice[0] == a[0] and twice[1].token_ids != a[0].token_ids
    plain = [dataclasses.replace(p, seed=None) for p in prompts]
    assert hf.generate(plain, params) == hf.generate(chats, params)


def test_openai_and_the_endpoint_pool_send_each_prompt_its_own_seed() -> None:
    from whale_lab.backends.openai import OpenAIBackend
    from whale_lab.backends.openai_pool import EndpointPool

    chats = [[{"role": "user", "content": f"p{i}"}] for i in range(4)]
    prompts: list[PromptLike] = [Prompt(tuple(c), 3, seed=500 + i) for i, c in enumerate(chats)]
    prompts[2] = chats[2]  # a chat keeps the call's seed plus its index
    params = SamplingParams(max_new_tokens=4, seed=100)
    want = {"p0": 500, "p1": 501, "p2": 102, "p3": 503}
    with FaultServer() as one, FaultServer() as two:
        for s in (one, two):
            s.set_default(echo_responder)
        single = OpenAIBackend(one.base_url, "m", concurrency=2, max_retries=0)
        pool = EndpointPool([OpenAIBackend(two.base_url, "m", max_retries=0), single])
        try:
            single.generate(prompts, params)
            pool.generate(prompts, params)
        finally:
            pool.close()
        bodies = [
            json.loads(r.body) for s in (one, two) for r in s.requests_to("/chat/completions")
        ]
    assert len(bodies) == 8  # 4 from the single endpoint, 4 spread over the pool's two
    for body in bodies:
        assert body["seed"] == want[body["messages"][-1]["content"]]


def test_vllm_gives_each_prompt_its_own_seed(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fake_vllm

    from whale_lab.backends.vllm import VLLMBackend

    fake_vllm.install(monkeypatch)
    backend = VLLMBackend(str(tiny_model_dir), max_context_tokens=256, enable_lora=False)
    seen: list[int | None] = []
    chat = backend.llm.chat

    def recording(messages: Any, sampling_params: Any, **kw: Any) -> Any:
        seen.extend(sp.seed for sp in sampling_params)
        return chat(messages, sampling_params, **kw)

    monkeypatch.setattr(backend.llm, "chat", recording)
    c = [{"role": "user", "content": "hi"}]
    a, b = backend.generate(
        [dataclasses.replace(backend.encode(c), seed=42), c], dataclasses.replace(SAMPLED, seed=9)
    )
    assert seen == [42, 10]
    (again,) = backend.generate([dataclasses.replace(backend.encode(c), seed=42)], SAMPLED)
    assert again == a


# ---------------------------------------------------------------- the rollout


def test_an_episode_samples_the_same_whatever_else_runs_beside_it(
    hf: HFBackend, harnesses: dict[str, Path]
) -> None:
    domain = CounterDomain()
    jobs = [(t, s) for t in domain.tasks("val") for s in range(2)]
    host = HarnessHost(harnesses["a"], "counter")
    try:
        together = run_episodes(jobs, domain, host, hf, SAMPLED, max_context_tokens=512)
        # episodes end at different turns, so later turns run in other company
        assert len({t.n_turns for t in together}) > 1
        for job, trace in zip(jobs, together, strict=True):
            (alone,) = run_episodes([job], domain, host, hf, SAMPLED, max_context_tokens=512)
            assert _turns(alone) == _turns(trace)
            assert (alone.reward, alone.stop_reason) == (trace.reward, trace.stop_reason)
        reordered = run_episodes(jobs[::-1], domain, host, hf, SAMPLED, max_context_tokens=512)
        assert [_turns(t) for t in reordered[::-1]] == [_turns(t) for t in together]
        # every turn samples anew: an episode's turns are not one repeated stream
        long = [t for t in together if t.n_turns > 1]
        assert any(len({r for r, _ in _turns(t)}) > 1 for t in long)
        # a (task, sample) given twice in one arm is two episodes, not one twice
        twice = run_episodes([jobs[0], jobs[0]], domain, host, hf, SAMPLED, max_context_tokens=512)
        assert _turns(twice[0]) == _turns(together[0]) != _turns(twice[1])
    finally:
        host.close()


def test_two_arms_that_render_the_same_prompt_get_the_same_completion(
    hf: HFBackend, harnesses: dict[str, Path]
) -> None:
    domain = CounterDomain()
    rec = Recording(hf)
    a, b = HarnessHost(harnesses["a"], "counter"), HarnessHost(harnesses["b"], "counter")
    try:
        pairs = [(t, s) for t in domain.tasks("val") for s in range(2)]
        jobs = [Job(t, s, arm=i, host=h) for i, h in enumerate((a, b)) for t, s in pairs]
        traces = run_episodes(jobs, domain, None, rec, SAMPLED, max_context_tokens=512)
    finally:
        a.close()
        b.close()
    first, second = traces[: len(pairs)], traces[len(pairs) :]
    assert {t.harness for t in first} != {t.harness for t in second}
    for x, y in zip(first, second, strict=True):
        assert x.turns[0].prompt == y.turns[0].prompt
        assert _turns(x)[0] == _turns(y)[0]  # the same prompt, seed and so completion
    # the parsers differ, so the arms part ways after their first turn
    assert [t.stop_reason for t in first] != [t.stop_reason for t in second]
    assert len(rec.calls[0]) == 2 * len(pairs)  # both arms in one generation call


# ---------------------------------------------------------------- Evaluator.score_arms


def _evaluator(backend: Any, batch_episodes: int = 4) -> Evaluator:
    return Evaluator(
        domain=CounterDomain(),
        backend=backend,
        sandbox=SandboxConfig(),
        max_context_tokens=512,
        batch_episodes=batch_episodes,
    )


def _plain(e: EpisodeFinished) -> tuple[Any, ...]:
    """What an announcement says of its episode (not where or when it was written)."""
    return (e.task_id, e.sample, e.turns, e.reward, e.stop_reason, e.tokens, e.harness, e.phase)


def _summary(report: Any) -> dict[str, Any]:
    return {k: v for k, v in report.summary().items() if k != "seconds"}


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_score_arms_scores_each_arm_as_scoring_it_alone(
    hf: HFBackend, harnesses: dict[str, Path], tmp_path: Path, params: SamplingParams
) -> None:
    tasks = CounterDomain().tasks("val")
    k = 2
    events: list[Event] = []
    paths = [harnesses["a"], harnesses["c"]]

    def sink(name: str, harness: str) -> EpisodeSink:
        return EpisodeSink.for_file(
            tmp_path / f"{name}.jsonl", tmp_path, events.append, phase="harness", harness=harness
        )

    alone = []
    for i, path in enumerate(paths):
        s = sink(f"alone{i}", f"arm{i}")
        alone.append(_evaluator(hf).score(path, tasks, k, params, on_episode=s))
        s.close()
    alone_events, events[:] = list(events), []
    rec = Recording(hf)
    sinks = [sink(f"joint{i}", f"arm{i}") for i in range(2)]
    joint = _evaluator(rec).score_arms(
        [Arm(p, params, s) for p, s in zip(paths, sinks, strict=True)], tasks, k
    )
    for s in sinks:
        s.close()
    for i in range(2):
        assert [t.to_dict() for t in joint[i].traces] == [t.to_dict() for t in alone[i].traces]
        assert _summary(joint[i]) == _summary(alone[i])
        # the same trace lines (in the order episodes finished: waves hold half as many pairs)
        a = (tmp_path / f"alone{i}.jsonl").read_text().splitlines()
        assert sorted((tmp_path / f"joint{i}.jsonl").read_text().splitlines()) == sorted(a)
    # the same episodes announced, and each arm's progress reported to its end
    finished = [e for e in events if isinstance(e, EpisodeFinished)]
    before = [e for e in alone_events if isinstance(e, EpisodeFinished)]
    for arm in ("arm0", "arm1"):
        mine = sorted(_plain(e) for e in finished if e.harness == arm)
        solo = sorted(_plain(e) for e in before if e.harness == arm)
        assert mine == solo
        last = [e for e in events if isinstance(e, ActivityProgress) and e.label == arm][-1]
        assert last.done == last.total == len(tasks) * k
    # waves of 2 (task, sample) pairs per arm: every call held both arms' episodes
    texts = [{m["content"].split("\n")[-1] for p in call for m in p.messages} for call in rec.calls]
    assert all({"say something", "answer now"} <= t for t in texts[:1])
    assert sum({"say something", "answer now"} <= t for t in texts) >= 3


def test_score_arms_shares_one_host_per_harness_and_keeps_other_seeds_apart(
    hf: HFBackend, harnesses: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[Path] = []
    init = HarnessHost.__init__

    def counting(self: HarnessHost, path: Any, *args: Any, **kwargs: Any) -> None:
        started.append(Path(path))
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(HarnessHost, "__init__", counting)
    tasks = CounterDomain().tasks("val")
    ev = _evaluator(hf, batch_episodes=64)
    other = dataclasses.replace(SAMPLED, seed=22)
    first, repeat = ev.score_arms(
        [Arm(harnesses["a"], SAMPLED), Arm(harnesses["a"], other)], tasks, 2
    )
    assert started == [harnesses["a"]]  # one host renders both arms, one round trip a turn
    assert [_turns(t) for t in first.traces] != [_turns(t) for t in repeat.traces]
    again = ev.score(harnesses["a"], tasks, 2, other)
    assert [t.to_dict() for t in repeat.traces] == [t.to_dict() for t in again.traces]
    with pytest.raises(ValueError, match="only in the seed"):
        ev.score_arms([Arm(harnesses["a"], SAMPLED), Arm(harnesses["c"], GREEDY)], tasks, 1)


def test_score_arms_stops_every_arm_together(hf: HFBackend, harnesses: dict[str, Path]) -> None:
    tasks = CounterDomain().tasks("val")
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 2

    reports = _evaluator(hf, batch_episodes=64).score_arms(
        [Arm(harnesses["a"], SAMPLED), Arm(harnesses["b"], SAMPLED)],
        tasks,
        2,
        should_stop=should_stop,
    )
    assert all(r.rollouts < len(tasks) * 2 for r in reports)
    assert all(t.stop_reason for r in reports for t in r.traces)


# ---------------------------------------------------------------- the harness phase


def test_the_incoming_harness_and_its_repeat_score_interleaved(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    from test_search_phase import H0_PATH, _events, _phase, make_cfg

    from whale_lab.backends import make_backend
    from whale_lab.config import config_from_dict
    from whale_lab.search.acceptance import measure_noise_floor

    inner = make_backend(config_from_dict({"model": {"path": str(tiny_model_dir)}}))
    rec = Recording(inner)
    cfg = make_cfg(tmp_path, harness_search={"acceptance": "paired"})
    phase = _phase(cfg, rec, tmp_path / "run")
    try:
        result = phase.run(H0_PATH, iterations=1)
        assert result.harness_rollouts == 3 + 3
        # one generation call holds both scorings' first turns, with other seeds per arm
        first = rec.calls[0]
        assert len(first) == 6 and len({json.dumps(p.messages) for p in first}) == 3
        assert len({p.seed for p in first}) == 6
        kinds = [
            (e["type"], e.get("harness", ""))
            for e in _events(tmp_path / "run")
            if e["type"] in ("episode_finished", "candidate_scored")
        ]
        assert kinds[-1][0] == "candidate_scored"
        assert (
            sorted(kinds[:-1])
            == [("episode_finished", "c000")] * 3 + [("episode_finished", "c000-repeat")] * 3
        )
        floor = phase.archive.read("c000", "noise_floor")
        assert phase.state["noise_floor"] == floor and floor["n_tasks"] == 3
        # a phase resumed between the two records measures the repeat alone: the same record
        alone, rollouts = measure_noise_floor(
            phase.archive,
            phase.evaluator,
            "c000",
            phase.tasks,
            phase.k,
            phase.params,
            root=tmp_path / "run",
            emit=lambda e: None,
            should_stop=lambda: False,
        )
        assert alone == floor and rollouts == 3
    finally:
        phase.store.close()
        inner.close()
