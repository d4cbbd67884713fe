"""Rollout throughput: the engine against plain batched generation and a per-episode loop.

Every arm generates for the same turn prompts, so the ratios compare like with like:
(a) engine: the rollout engine (`score_harness`: harness host, environment, tools, traces);
(b) upper: the engine's turn prompts as plain batched `model.generate` calls (chunks of
    `sampling.batch_size`, each forced to its longest completion), sampling as `cfg.sampling` says;
(b') upper_cb: the same turn prompts through the backend's continuous batching with no harness,
    environment or tools (the same calls the engine makes, so the same completions);
(c) loop: what a research script typically does: one `generate` per episode and turn, on episodes
    spread over every task, each episode's environment stepped with its turns' actions (the
    model's tool code run in the same sandboxed workers, answers checked);
(a') engine_cold: the engine again with no rows kept between turns (`model.hf.prefix_cache_mb = 0`),
    so `engine_vs_no_prefix_cache` says what keeping an episode's cache between its turns is worth.
Every arm starts with no rows kept from an earlier one.

Each arm is warmed first, then the arms run over `--rounds` rounds, in an order that rotates from
round to round (so no arm always follows the same one). Every arm replays the turn prompts of one
engine run made before the rounds; the engine's own rounds draw the same episodes (prompts are
seeded by episode), which `engine_same_tokens` confirms. Time is CPU seconds of this process and
everything below it, the sandboxed tool workers and harness host included (`tree_cpu.py`: live
processes read from /proc, stopped ones just before they stop), the only figure stable on a
shared machine; ratios are the median of the per-round ratios (min and max beside it).

    OMP_NUM_THREADS=1 python benchmarks/rollout_throughput.py --domain math --tasks 16 --k 8

Targets at k = 8: engine / upper >= 0.85, engine / loop >= 4, decode-slot use >= 70%.
`--static` runs the backend's padded path (one `model.generate` per chunk) for comparison.
`--json` prints one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

import whale_lab.rollout as rollout
from whale_lab.backends.base import SamplingParams
from whale_lab.backends.hf import HFBackend
from whale_lab.config import Config, load_config
from whale_lab.domains import make_domain
from whale_lab.domains.base import Action, Domain, Task
from whale_lab.evaluate import default_harness_path, sampling_params, score_harness
from whale_lab.harness import HarnessHost
from whale_lab.quiet import quiet_libraries
from whale_lab.trace import EpisodeTrace

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tree_cpu  # noqa: E402  (benchmarks/ is not a package)


def cpu_total() -> float:
    """CPU seconds so far of this process and every process below it."""
    return tree_cpu.seconds()


def own_cpu() -> float:
    t = os.times()
    return t.user + t.system


@dataclass
class Split:
    """Where the engine arm's CPU went, besides generation."""

    tool_self: float = 0.0  # environment steps (tools included), in this process
    host_self: float = 0.0  # render/parse round trips, this side

    def reset(self) -> None:
        self.tool_self = self.host_self = 0.0


SPLIT = Split()
_LOCK = threading.Lock()


@contextmanager
def _timed(add: Callable[[float], None]) -> Iterator[None]:
    s0 = own_cpu()
    try:
        yield
    finally:
        s1 = own_cpu()
        with _LOCK:
            add(s1 - s0)


def _instrument() -> None:
    """Count environment steps and harness round trips (module attributes, read at call time).

    This side's CPU only: the tool workers' and harness host's own CPU is read per process kind
    (`tree_cpu`)."""
    tree_cpu.track_departures()
    step_all = rollout._step_all

    def timed_steps(pairs: list[Any]) -> list[Any]:
        def add(s: float) -> None:
            SPLIT.tool_self += s

        with _timed(add):
            return step_all(pairs)

    rollout._step_all = timed_steps  # type: ignore[assignment]
    for name in ("render", "parse"):
        method = getattr(HarnessHost, name)

        def wrapped(self: HarnessHost, requests: Any, _m: Any = method) -> Any:
            def add(s: float) -> None:
                SPLIT.host_self += s

            with _timed(add):
                return _m(self, requests)

        setattr(HarnessHost, name, wrapped)


def run_engine(
    cfg: Config,
    domain: Domain,
    backend: HFBackend,
    tasks: list[Task],
    k: int,
    params: SamplingParams,
) -> list[EpisodeTrace]:
    report = score_harness(
        domain,
        default_harness_path(cfg),
        tasks,
        k,
        backend,
        params,
        sandbox=cfg.sandbox,
        batch_episodes=len(tasks) * k,
        max_context_tokens=cfg.model.max_context_tokens,
    )
    return list(report.traces)


def turn_calls(traces: list[EpisodeTrace]) -> list[list[tuple[Any, int]]]:
    """The engine's generate calls: per turn, (messages, completion tokens) in call order."""
    calls: list[list[tuple[Any, int]]] = []
    for tr in traces:  # traces come in job order, the order of each turn's call
        for i, turn in enumerate(tr.turns):
            while len(calls) <= i:
                calls.append([])
            calls[i].append((turn.prompt, turn.completion_tokens))
    return calls


def plain_generate(
    backend: HFBackend, cfg: Config, prompts: list[list[int]], new_tokens: int
) -> None:
    """One plain left-padded `model.generate`, forced to `new_tokens`, sampling per cfg.sampling."""
    s = cfg.sampling
    tok, model = backend.tokenizer, backend.model
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    sampling: dict[str, Any] = (
        {"do_sample": False}
        if s.temperature == 0.0
        else {"do_sample": True, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p}
    )
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=pad,
            **sampling,
        )


def run_upper(backend: HFBackend, cfg: Config, calls: list[list[tuple[list[int], int]]]) -> None:
    size = cfg.sampling.batch_size
    for rows in calls:
        for start in range(0, len(rows), size):
            chunk = rows[start : start + size]
            plain_generate(backend, cfg, [p for p, _ in chunk], max(1, max(n for _, n in chunk)))


def run_upper_cb(
    backend: HFBackend,
    calls: list[list[tuple[Any, int]]],
    params: SamplingParams,
    stop: tuple[str, ...],
) -> int:
    p = replace(params, stop=stop) if stop else params
    return sum(
        g.completion_tokens for rows in calls for g in backend.generate([m for m, _ in rows], p)
    )


LoopTurn = tuple[list[int], int, dict[str, Any] | None]  # prompt ids, tokens, action


def run_loop(
    backend: HFBackend,
    cfg: Config,
    domain: Domain,
    episodes: list[tuple[Task, list[LoopTurn]]],
) -> None:
    """One episode at a time, one generate per turn, and the episode's own environment stepped
    with each turn's action (the model's tool code run, the answer checked), as a research
    script does: the tool work is the engine's, so the ratio compares what is around it."""
    for task, turns in episodes:
        env = domain.make_env(task)
        env.initial_observation()
        for prompt, n, action in turns:
            plain_generate(backend, cfg, [prompt], max(1, n))
            if action is not None and action.get("kind") != "invalid":
                env.step(Action(**action))
        env.final_info()


def engine_without_kept_rows(
    cfg: Config,
    domain: Domain,
    backend: HFBackend,
    tasks: list[Task],
    k: int,
    params: SamplingParams,
) -> tuple[int, float]:
    """(completion tokens, CPU seconds) of the engine arm with no rows kept between turns: what
    the prefix cache is worth, in the same rounds. (0, 0.0) when the cache is off anyway."""
    size = backend.prefix_cache.max_bytes
    if size == 0:
        return 0, 0.0
    backend.prefix_cache.clear()
    backend.prefix_cache.max_bytes = 0
    try:
        t0 = cpu_total()
        traces = run_engine(cfg, domain, backend, tasks, k, params)
        return sum(t.completion_tokens for t in traces), cpu_total() - t0
    finally:
        backend.prefix_cache.max_bytes = size


def ratio_stats(xs: list[float]) -> dict[str, float]:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--domain", default="math", choices=["math", "search", "chess"])
    ap.add_argument("--model", default="micro")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--loop-episodes",
        type=int,
        default=16,
        help="episodes timed for the per-episode loop, spread over all tasks",
    )
    ap.add_argument("--batch-size", type=int, default=None, help="sampling.batch_size")
    ap.add_argument(
        "--static",
        action="store_true",
        help="the backend's padded path instead of continuous batching",
    )
    ap.add_argument(
        "--no-prefix-cache",
        action="store_true",
        help="keep no rows between turns (every prompt prefilled in full)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    quiet_libraries()
    overrides = [
        f"domain.name={args.domain}",
        f'model.path="{args.model}"',
        f"domain.splits.val={args.tasks}",
    ]
    if args.batch_size is not None:
        overrides.append(f"sampling.batch_size={args.batch_size}")
    cfg = load_config(None, overrides)
    domain = make_domain(cfg)
    backend = HFBackend.from_config(cfg)
    backend.continuous = not args.static
    if args.no_prefix_cache:
        backend.prefix_cache.max_bytes = 0
    tasks = domain.tasks("val")[: args.tasks]
    params = sampling_params(cfg, seed=0)
    probe = HarnessHost(default_harness_path(cfg), domain.name, cfg.sandbox)
    try:  # the stop sequences the engine passes to the backend
        harness_stop = tuple(probe.info.stop_sequences or ())
    finally:
        probe.close()
    _instrument()

    # Warm every arm on a small slice (imports, allocator, thread pools, the host binary).
    warm = run_engine(cfg, domain, backend, tasks[:2], 2, params)
    warm_calls = turn_calls(warm)
    warm_ids = [[(backend.encode_chat(m), n) for m, n in rows] for rows in warm_calls]
    run_upper(backend, cfg, warm_ids)
    run_upper_cb(backend, warm_calls, params, harness_stop)
    by_id = {str(t.id): t for t in tasks}

    def loop_episodes(traces: list[EpisodeTrace]) -> list[tuple[Task, list[LoopTurn]]]:
        return [
            (
                by_id[str(tr.task_id)],
                [(backend.encode_chat(t.prompt), t.completion_tokens, t.action) for t in tr.turns],
            )
            for tr in traces
        ]

    run_loop(backend, cfg, domain, loop_episodes(warm[:2]))

    # One engine run fixes the turn prompts every other arm replays (the engine's rounds draw
    # the same episodes: prompts are seeded by episode).
    backend.prefix_cache.clear()
    reference = run_engine(cfg, domain, backend, tasks, args.k, params)
    tokens = sum(t.completion_tokens for t in reference)
    episodes, turns = len(reference), sum(t.n_turns for t in reference)
    calls = turn_calls(reference)
    ids = [[(backend.encode_chat(m), n) for m, n in rows] for rows in calls]
    stride = max(1, len(reference) // max(1, args.loop_episodes))
    subset = reference[::stride][: args.loop_episodes]
    loop_eps = loop_episodes(subset)
    loop_tokens = sum(t.completion_tokens for t in subset)

    rounds: list[dict[str, float]] = []
    slot_use: list[float] = []
    fill: list[float] = []
    shares: list[tuple[float, float]] = []
    reused: list[float] = []  # share of the engine's prompt tokens taken from kept rows
    same_tokens = engine_same_tokens = True

    def arm_engine(out: dict[str, float]) -> None:
        nonlocal engine_same_tokens
        SPLIT.reset()
        backend.decode_stats.reset()
        backend.prefix_cache.stats.reset()
        c0 = tree_cpu.read()
        traces = run_engine(cfg, domain, backend, tasks, args.k, params)
        c1 = tree_cpu.read()
        reused.append(
            backend.prefix_cache.stats.reused_tokens
            / max(1, sum(t.prompt_tokens for tr in traces for t in tr.turns))
        )
        engine_s = c1.total - c0.total
        slot_use.append(backend.decode_stats.slot_use)
        fill.append(backend.decode_stats.fill)
        shares.append(
            (
                (SPLIT.tool_self + c1.kind("tool") - c0.kind("tool")) / engine_s,
                (SPLIT.host_self + c1.kind("host") - c0.kind("host")) / engine_s,
            )
        )
        got = sum(t.completion_tokens for t in traces)
        engine_same_tokens = engine_same_tokens and got == tokens
        out["engine"] = got / engine_s

    def arm_upper(out: dict[str, float]) -> None:
        t0 = cpu_total()
        run_upper(backend, cfg, ids)
        out["upper"] = tokens / (cpu_total() - t0)

    def arm_upper_cb(out: dict[str, float]) -> None:
        nonlocal same_tokens
        t0 = cpu_total()
        cb_tokens = run_upper_cb(backend, calls, params, harness_stop)
        out["upper_cb"] = cb_tokens / (cpu_total() - t0)
        same_tokens = same_tokens and cb_tokens == tokens

    def arm_loop(out: dict[str, float]) -> None:
        t0 = cpu_total()
        run_loop(backend, cfg, domain, loop_eps)
        out["loop"] = loop_tokens / max(cpu_total() - t0, 1e-9)

    def arm_engine_cold(out: dict[str, float]) -> None:
        cold_tokens, cold_s = engine_without_kept_rows(cfg, domain, backend, tasks, args.k, params)
        out["engine_cold"] = cold_tokens / max(cold_s, 1e-9) if cold_s else 0.0

    arms = [arm_engine, arm_upper, arm_upper_cb, arm_loop, arm_engine_cold]
    orders: list[list[str]] = []
    for r in range(args.rounds):
        out: dict[str, float] = {}
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        orders.append([a.__name__.removeprefix("arm_") for a in order])
        for arm in order:
            backend.prefix_cache.clear()  # every arm starts cold: no rows kept from the last arm
            arm(out)
        rounds.append(out)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    vs_upper = [r["engine"] / r["upper"] for r in rounds]
    vs_cb = [r["engine"] / r["upper_cb"] for r in rounds]
    vs_loop = [r["engine"] / r["loop"] for r in rounds]
    vs_cold = [r["engine"] / r["engine_cold"] for r in rounds if r["engine_cold"]]
    result = {
        "engine_tok_per_cpu_s": med("engine"),
        "upper_tok_per_cpu_s": med("upper"),
        "loop_tok_per_cpu_s": med("loop"),
        "engine_vs_upper": statistics.median(vs_upper),
        "engine_vs_loop": statistics.median(vs_loop),
        "decode_slot_use": statistics.median(slot_use),
        "tool_share": statistics.median(s[0] for s in shares),
        "host_share": statistics.median(s[1] for s in shares),
        "decode_fill": statistics.median(fill),
        "prefix_reused_share": statistics.median(reused),
        # the engine with rows kept between turns against the engine without, per round
        "engine_vs_no_prefix_cache": statistics.median(vs_cold) if vs_cold else None,
        "engine_vs_no_prefix_cache_range": ratio_stats(vs_cold) if vs_cold else None,
        "upper_cb_tok_per_cpu_s": med("upper_cb"),
        "engine_vs_upper_cb": statistics.median(vs_cb),
        "engine_vs_upper_range": ratio_stats(vs_upper),
        "engine_vs_upper_cb_range": ratio_stats(vs_cb),
        "engine_vs_loop_range": ratio_stats(vs_loop),
        "per_round": {  # each round's ratios, to pool runs
            "engine_vs_upper": vs_upper,
            "engine_vs_upper_cb": vs_cb,
            "engine_vs_loop": vs_loop,
            "engine_vs_no_prefix_cache": vs_cold,
        },
        "upper_cb_same_tokens": same_tokens,
        "engine_same_tokens": engine_same_tokens,
        "arm_orders": orders,
        "cpu_counts_sandboxed": tree_cpu.read().exact,
        "domain": args.domain,
        "model": cfg.model.path,
        "tasks": len(tasks),
        "k": args.k,
        "episodes": episodes,
        "turns": turns,
        "completion_tokens": tokens,
        "batch_size": cfg.sampling.batch_size,
        "rounds": args.rounds,
        "path": "static" if args.static else "continuous",
        "prefix_cache_mb": backend.prefix_cache.max_bytes // 2**20,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "torch_threads": torch.get_num_threads(),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"domain {args.domain}, model {cfg.model.path}, {len(tasks)} tasks x k={args.k} = "
        f"{episodes} episodes, {turns} turns, {tokens} completion tokens; "
        f"{result['path']} backend, batch {cfg.sampling.batch_size}, {args.rounds} rounds, "
        f"torch threads {torch.get_num_threads()}"
    )
    print(f"(a)  engine           {result['engine_tok_per_cpu_s']:8.1f} tok/CPU-s")
    print(f"(b)  plain batched    {result['upper_tok_per_cpu_s']:8.1f} tok/CPU-s")
    print(
        f"(b') backend, bare    {result['upper_cb_tok_per_cpu_s']:8.1f} tok/CPU-s"
        f"  (same tokens as the engine: {same_tokens})"
    )
    print(f"(c)  per-episode loop {result['loop_tok_per_cpu_s']:8.1f} tok/CPU-s")
    arms = [
        ("engine / plain batched", "engine_vs_upper", ">= 0.85"),
        ("engine / backend bare", "engine_vs_upper_cb", ""),
        ("engine / per-episode loop", "engine_vs_loop", ">= 4"),
    ]
    if vs_cold:
        arms.append(("engine / no kept rows", "engine_vs_no_prefix_cache", ""))
    for name, key, target in arms:
        r = result[f"{key}_range"]
        print(
            f"{name:26} = {result[key]:.2f}  (min {r['min']:.2f}, max {r['max']:.2f})"
            + (f"  target {target}" if target else "")
        )
    print(
        f"decode-slot use {result['decode_slot_use']:.0%} (target >= 70%; with the tail of "
        f"each call, when the batch drains: {result['decode_fill']:.0%}); "
        f"CPU share of tools {result['tool_share']:.0%}, of the harness host "
        f"{result['host_share']:.0%}; prompt tokens from rows kept between turns "
        f"{result['prefix_reused_share']:.0%}"
    )


if __name__ == "__main__":
    main()
