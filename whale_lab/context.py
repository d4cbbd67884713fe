"""What every phase, probe and evaluation shares, bound once per run.

`RunContext` replaces the five arguments (config, backend, domain, store, emit) each phase-like
class used to take. `EpisodeSink` is the one way a finished episode is recorded: one trace line
(scrubbed of anything that could name a reference answer) and one `EpisodeFinished` event that
points at it. `Evaluator` is the one way episodes are run and scored: it binds the sandbox
settings, the context limit and the wave size from the config, so no caller threads them by hand.
`Evaluator.score_arms` scores the arms of a paired comparison in the same waves and the same
generation calls, so whatever drifts while they run (a server's load, its batching) lands on both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.config import Config, SandboxConfig
from whale_lab.events import ActivityProgress, EpisodeFinished, Event
from whale_lab.store import JsonlWriter, RunStore
from whale_lab.trace import EpisodeTrace, scrub_trace

if TYPE_CHECKING:
    from whale_lab.backends.base import Backend, SamplingParams
    from whale_lab.domains.base import Domain, Task
    from whale_lab.evaluate import EvalReport

Emit = Callable[[Event], None]


class EpisodeSink:
    """Writes each finished episode's trace and announces it, always the same way.

    The scrub policy lives here and nowhere else: every trace written to disk drops the `info`
    keys that could carry a reference answer (`trace.PRIVATE_INFO_KEYS`).
    """

    def __init__(
        self,
        writer: JsonlWriter,
        rel_path: str,
        emit: Emit | None,
        *,
        phase: str,
        harness: str,
        info: dict[str, Any] | None = None,
        owns_writer: bool = False,
    ) -> None:
        self.writer = writer
        self.rel_path = rel_path
        self.emit = emit
        self.phase = phase
        self.harness = harness
        self.info = dict(info or {})
        self._owns_writer = owns_writer

    @classmethod
    def for_store(
        cls,
        store: RunStore,
        emit: Emit | None,
        name: str,
        *,
        phase: str,
        harness: str,
        info: dict[str, Any] | None = None,
    ) -> EpisodeSink:
        """A sink into the run's shared `traces/<name>.jsonl`."""
        return cls(
            store.trace_writer(name),
            f"traces/{name}.jsonl",
            emit,
            phase=phase,
            harness=harness,
            info=info,
        )

    @classmethod
    def for_file(
        cls,
        path: Path,
        root: Path,
        emit: Emit | None,
        *,
        phase: str,
        harness: str,
        info: dict[str, Any] | None = None,
    ) -> EpisodeSink:
        """A sink into a file of its own (a candidate's traces); `close()` it when done."""
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            rel = str(path)
        return cls(
            JsonlWriter(path), rel, emit, phase=phase, harness=harness, info=info, owns_writer=True
        )

    def __call__(self, trace: EpisodeTrace) -> None:
        rec = trace.to_dict()
        if self.info:
            rec["info"] = {**rec.get("info", {}), **self.info}
        line = self.writer.append(scrub_trace(rec))
        if self.emit is not None:
            self.emit(
                EpisodeFinished(
                    phase=self.phase,
                    task_id=trace.task_id,
                    sample=trace.sample,
                    turns=trace.n_turns,
                    reward=trace.reward,
                    stop_reason=trace.stop_reason,
                    tokens=trace.prompt_tokens + trace.completion_tokens,
                    harness=self.harness,
                    trace_path=self.rel_path,
                    trace_line=line,
                )
            )

    def close(self) -> None:
        if self._owns_writer:
            self.writer.close()


class ProgressSink:
    """An episode sink that also reports how far its scoring has come (`ActivityProgress`).

    Reports at the start, then at most every `interval` seconds, and at the end: a few events
    a second at most, however fast the episodes finish.
    """

    def __init__(
        self,
        sink: EpisodeSink,
        emit: Emit,
        activity: str,
        label: str,
        total: int,
        interval: float = 0.5,
    ) -> None:
        self.sink, self.emit = sink, emit
        self.activity, self.label, self.total = activity, label, total
        self.interval = interval
        self.done = self.tokens = 0
        self.t0 = time.monotonic()
        self._last = self.t0
        self._report()

    def _report(self) -> None:
        self.emit(
            ActivityProgress(
                activity=self.activity,
                label=self.label,
                done=self.done,
                total=self.total,
                tokens=self.tokens,
                seconds=round(time.monotonic() - self.t0, 3),
            )
        )

    def __call__(self, trace: EpisodeTrace) -> None:
        self.sink(trace)
        self.done += 1
        self.tokens += trace.prompt_tokens + trace.completion_tokens
        now = time.monotonic()
        if self.done >= self.total or now - self._last >= self.interval:
            self._last = now
            self._report()


def with_progress(
    on_episode: Callable[[EpisodeTrace], None] | None, label: str, total: int
) -> Callable[[EpisodeTrace], None] | None:
    """`on_episode` reporting its progress where it is a run's episode sink (evaluations and
    candidate scoring); anything else is returned as it is."""
    if not isinstance(on_episode, EpisodeSink) or on_episode.emit is None or total <= 0:
        return on_episode
    activity = "eval" if on_episode.phase == "eval" else "scoring"
    return ProgressSink(on_episode, on_episode.emit, activity, label or on_episode.harness, total)


@dataclass(frozen=True)
class Arm:
    """One arm of a paired comparison: a harness, its sampling (the arms may differ only in the
    seed), where its episodes go, and optionally a started host for it (else one is started per
    harness file and shared by the arms that name it)."""

    harness_path: str | Path
    params: SamplingParams
    on_episode: Callable[[EpisodeTrace], None] | None = None
    host: Any = None
    label: str = ""


@dataclass(frozen=True)
class Evaluator:
    """Runs and scores episodes with the run's sandbox, context limit and wave size bound once."""

    domain: Domain
    backend: Backend
    sandbox: SandboxConfig
    max_context_tokens: int
    batch_episodes: int
    max_invalid_share: float = 0.05  # more invalid (backend-error) episodes in a wave stop scoring

    @classmethod
    def from_config(cls, cfg: Config, backend: Backend, domain: Domain) -> Evaluator:
        return cls(
            domain=domain,
            backend=backend,
            sandbox=cfg.sandbox,
            max_context_tokens=cfg.model.max_context_tokens,
            batch_episodes=max(1, cfg.sampling.batch_size) * 4,
            max_invalid_share=cfg.sampling.max_invalid_share,
        )

    def host(self, harness_path: str | Path) -> Any:
        """A started harness host for `harness_path` (the caller closes it)."""
        from whale_lab.harness import HarnessHost

        return HarnessHost(harness_path, self.domain.name, self.sandbox)

    def score(
        self,
        harness_path: str | Path,
        tasks: Sequence[Task],
        k: int,
        params: SamplingParams,
        *,
        on_episode: Callable[[EpisodeTrace], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
        host: Any = None,
        label: str = "",
    ) -> EvalReport:
        """k rollouts per task under one harness, in waves; see `evaluate.score_harness`.
        A run's episode sink also reports progress, named `label` (the split) or the harness."""
        from whale_lab.evaluate import score_harness

        on_episode = with_progress(on_episode, label, len(tasks) * k)

        return score_harness(
            self.domain,
            harness_path,
            tasks,
            k,
            self.backend,
            params,
            sandbox=self.sandbox,
            max_context_tokens=self.max_context_tokens,
            batch_episodes=self.batch_episodes,
            max_invalid_share=self.max_invalid_share,
            on_episode=on_episode,
            should_stop=should_stop,
            host=host,
        )

    def score_arms(
        self,
        arms: Sequence[Arm],
        tasks: Sequence[Task],
        k: int,
        *,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[EvalReport]:
        """k rollouts per task under every arm, interleaved; one report per arm, in order.

        Each wave holds the same (task, sample) pairs for every arm (a wave of `batch_episodes`
        episodes in all), and every turn of it is one generation over all arms' episodes: the
        episodes share the backend's calls, not its state, and each prompt's seed depends only
        on its arm's seed, task, sample and turn, so each arm scores as `score` would alone
        (exactly so on the hf backend), with the same traces, sink and progress reports. The
        invalid-episode check runs per arm and wave, as `score` runs it; `seconds` is the
        joint wall time. A stop leaves every arm with fewer rollouts than tasks x k.
        """
        from whale_lab.evaluate import check_invalid_share, report_of
        from whale_lab.rollout import Job, run_episodes

        if not arms:
            return []
        base = dataclasses.replace(arms[0].params, seed=None)
        for arm in arms[1:]:
            if dataclasses.replace(arm.params, seed=None) != base:
                raise ValueError("score_arms: the arms' sampling may differ only in the seed")
        t0 = time.perf_counter()
        hosts: list[Any] = []
        opened: dict[str, Any] = {}
        collected: list[set[int]] = [set() for _ in arms]

        def collect(i: int, sink: Callable[[EpisodeTrace], None] | None) -> Any:
            def on_episode(trace: EpisodeTrace) -> None:
                collected[i].add(id(trace))
                if sink is not None:
                    sink(trace)

            return on_episode

        try:
            for arm in arms:
                if arm.host is None:
                    key = str(Path(arm.harness_path).resolve())
                    if key not in opened:
                        opened[key] = self.host(arm.harness_path)
                    hosts.append(opened[key])
                else:
                    hosts.append(arm.host)
            sinks = [
                collect(i, with_progress(arm.on_episode, arm.label, len(tasks) * k))
                for i, arm in enumerate(arms)
            ]
            pairs = [(task, s) for task in tasks for s in range(k)]
            per_wave = max(1, self.batch_episodes // len(arms))
            traces: list[list[EpisodeTrace]] = [[] for _ in arms]
            for start in range(0, len(pairs), per_wave):
                if should_stop is not None and should_stop():
                    break
                wave = pairs[start : start + per_wave]
                jobs = [
                    Job(task, s, arm=i, host=hosts[i], seed=arm.params.seed, on_episode=sinks[i])
                    for i, arm in enumerate(arms)
                    for task, s in wave
                ]
                done = run_episodes(
                    jobs,
                    self.domain,
                    None,
                    self.backend,
                    base,
                    max_context_tokens=self.max_context_tokens,
                    should_stop=should_stop,
                )
                for i in range(len(arms)):
                    mine = [t for t in done if id(t) in collected[i]]
                    traces[i].extend(mine)
                    check_invalid_share(mine, self.backend, self.max_invalid_share)
        finally:
            for host in opened.values():
                host.close()
        seconds = time.perf_counter() - t0
        return [report_of(t, k, seconds) for t in traces]

    def score_splits(
        self,
        harness_path: str | Path,
        splits: Sequence[tuple[str, Sequence[Task], SamplingParams]],
        k: int,
        *,
        sink: Callable[[str], Callable[[EpisodeTrace], None] | None] | None = None,
        wanted: Callable[[str, Mapping[str, EvalReport]], bool] | None = None,
        should_stop: Callable[[], bool] | None = None,
        host: Any = None,
    ) -> dict[str, EvalReport]:
        """The splits of one evaluation point under one harness host, in one call.

        Each split keeps its own sampling seed and its own waves, so it scores exactly as it
        would alone (a generation call takes one seed; mixing splits in one call would change
        the samples). `wanted(split, done)` sees the splits scored so far and may skip a later
        one (test only where val is a new best); `sink(split)` gives that split's episode sink.
        Returns the splits scored; a stop leaves the cut split last, with fewer rollouts than
        its tasks x k (a part of a split is not a score), and scores nothing after it.
        """
        own_host = host is None
        if own_host:
            host = self.host(harness_path)
        reports: dict[str, EvalReport] = {}
        try:
            for split, tasks, params in splits:
                if wanted is not None and not wanted(split, reports):
                    continue
                report = self.score(
                    harness_path,
                    tasks,
                    k,
                    params,
                    on_episode=sink(split) if sink is not None else None,
                    should_stop=should_stop,
                    host=host,
                    label=split,
                )
                reports[split] = report
                if report.rollouts < len(tasks) * k:
                    break
        finally:
            if own_host:
                host.close()
        return reports

    def episodes(
        self,
        jobs: Sequence[tuple[Task, int]],
        host: Any,
        params: SamplingParams,
        *,
        on_episode: Callable[[EpisodeTrace], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[EpisodeTrace]:
        """One batch of (task, sample) episodes under a started host, traces in job order."""
        from whale_lab.rollout import run_episodes

        return run_episodes(
            jobs,
            self.domain,
            host,
            self.backend,
            params,
            max_context_tokens=self.max_context_tokens,
            on_episode=on_episode,
            should_stop=should_stop,
        )


@dataclass(frozen=True)
class RunContext:
    """The run's config, model backend, domain, run folder and event sink, passed as one."""

    cfg: Config
    backend: Backend
    domain: Domain
    store: RunStore
    emit: Emit

    @classmethod
    def of(
        cls, cfg: Config, backend: Any, domain: Any, store: RunStore, emit: Emit | None = None
    ) -> RunContext:
        return cls(cfg, backend, domain, store, emit or store.emit)

    def with_emit(self, emit: Emit) -> RunContext:
        return dataclasses.replace(self, emit=emit)

    @property
    def evaluator(self) -> Evaluator:
        return Evaluator.from_config(self.cfg, self.backend, self.domain)

    def sink(
        self, name: str, *, phase: str, harness: str, info: dict[str, Any] | None = None
    ) -> EpisodeSink:
        """A sink into this run's `traces/<name>.jsonl` announcing through `emit`."""
        return EpisodeSink.for_store(
            self.store, self.emit, name, phase=phase, harness=harness, info=info
        )
