"""Rollout throughput: the engine against a plain batched `generate` and a per-episode loop.

All three generate the same completions for the same prompts in one run, so the ratios are fair:
(a) the rollout engine (harness host, environment, traces included);
(b) the upper bound: the same turn prompts as one plain batched `model.generate` per turn, forced to
    the same lengths; and
(c) what a research script typically does: one `generate` call per episode and turn.

    python benchmarks/rollout_throughput.py --domain math --tasks 16 --k 8

Targets: (a)/(b) >= 0.85 and (a)/(c) >= 4 at k = 8.
"""

from __future__ import annotations

import argparse
import time

import torch

from whale_lab.backends.hf import HFBackend
from whale_lab.config import load_config
from whale_lab.domains import make_domain
from whale_lab.evaluate import default_harness_path, sampling_params, score_harness
from whale_lab.quiet import quiet_libraries


def _plain_generate(backend: HFBackend, prompts: list[list[int]], new_tokens: int) -> None:
    tok, model = backend.tokenizer, backend.model
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0,
                       top_k=20, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       pad_token_id=pad)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--domain", default="math", choices=["math", "search", "chess"])
    ap.add_argument("--model", default="micro")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--loop-episodes", type=int, default=16,
                    help="episodes timed for the per-episode loop (it is slow; tokens/s is what counts)")
    args = ap.parse_args()
    quiet_libraries()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    cfg = load_config(None, [f"domain.name={args.domain}", f'model.path="{args.model}"',
                             f"domain.splits.val={args.tasks}"])
    domain = make_domain(cfg)
    backend = HFBackend.from_config(cfg)
    tasks = domain.tasks("val")[: args.tasks]
    params = sampling_params(cfg, seed=0)

    # (a) the rollout engine
    t0 = time.perf_counter()
    report = score_harness(domain, default_harness_path(cfg), tasks, args.k, backend, params,
                           sandbox=cfg.sandbox, batch_episodes=len(tasks) * args.k)
    engine_s = time.perf_counter() - t0
    traces = report.traces
    tokens = sum(t.completion_tokens for t in traces)
    engine_tps = tokens / engine_s

    # (b) plain batched generate over the same turn prompts, same lengths
    by_turn: dict[int, list[tuple[list[int], int]]] = {}
    for tr in traces:
        for i, turn in enumerate(tr.turns):
            by_turn.setdefault(i, []).append((backend.encode_chat(turn.prompt), turn.completion_tokens))
    t0 = time.perf_counter()
    for rows in by_turn.values():
        _plain_generate(backend, [p for p, _ in rows], max(1, max(n for _, n in rows)))
    plain_s = time.perf_counter() - t0
    plain_tps = tokens / plain_s

    # (c) a per-episode loop of single generations, on a subset
    subset = traces[: args.loop_episodes]
    loop_tokens = sum(t.completion_tokens for t in subset)
    t0 = time.perf_counter()
    for tr in subset:
        for turn in tr.turns:
            _plain_generate(backend, [backend.encode_chat(turn.prompt)], max(1, turn.completion_tokens))
    loop_s = time.perf_counter() - t0
    loop_tps = loop_tokens / loop_s

    print(f"domain {args.domain}, model {cfg.model.path}, {len(tasks)} tasks x k={args.k} "
          f"= {len(traces)} episodes, {tokens} completion tokens, "
          f"{sum(t.n_turns for t in traces)} turns")
    print(f"(a) rollout engine       {engine_tps:9.1f} tok/s  ({engine_s:.2f} s)")
    print(f"(b) plain batched gen    {plain_tps:9.1f} tok/s  ({plain_s:.2f} s)")
    print(f"(c) per-episode loop     {loop_tps:9.1f} tok/s  ({loop_s:.2f} s on {len(subset)} episodes)")
    print(f"engine / batched upper bound = {engine_tps / plain_tps:.2f}  (target >= 0.85)")
    print(f"engine / per-episode loop    = {engine_tps / loop_tps:.2f}  (target >= 4)")


if __name__ == "__main__":
    main()
