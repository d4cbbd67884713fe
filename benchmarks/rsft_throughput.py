"""RSFT update throughput against a plain peft training loop, and how fast new weights go live.

1. Tokens per second of `whale_lab.weights.sft.sft_pass` versus the textbook peft loop
   (`model(input_ids, attention_mask, labels)` -> `loss.backward()` -> clip -> AdamW step) on the
   very same minibatches, with the same LoRA config. Passes alternate (ours, plain, ours, ...) and
   the median pass time of each is compared; the target ratio is >= 0.9.
2. Time until the backend generates with the new weights:
   * hf: in place; the publish step is a no-op, and a greedy generate right after the update is
     checked to differ from the one before it;
   * openai: save the adapter + `load_adapter` round trip against the local adapter server
     (tests/adapter_server.py), or against a real vLLM server with `--base-url`.

    python benchmarks/rsft_throughput.py                      # the tiny random model, CPU
    python benchmarks/rsft_throughput.py --model micro --examples 64
    python benchmarks/rsft_throughput.py --hidden 512 --layers 8 --device cuda
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _examples(
    n: int, vocab: int, prefix: tuple[int, int], target: tuple[int, int], seed: int
) -> list[Any]:
    """Prompt/response-shaped sequences: a masked prefix, then target tokens carrying loss."""
    from whale_lab.weights.sft import IGNORE_INDEX, SftExample

    rng = random.Random(seed)
    out = []
    for _ in range(n):
        p, t = rng.randint(*prefix), rng.randint(*target)
        ids = [rng.randrange(8, vocab) for _ in range(p + t)]
        out.append(SftExample(tuple(ids), tuple([IGNORE_INDEX] * p + ids[p:])))
    return out


def _plain_peft_pass(
    model: Any, opt: Any, batches: list[list[Any]], pad_id: int, clip: float, device: Any
) -> None:
    """The loop everyone writes first: HF computes the (token-mean) loss from `labels`."""
    import torch

    from whale_lab.weights.sft import collate

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for mb in batches:
        batch = collate(mb, pad_id, device)
        out = model(**batch)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)


def _sync(device: Any) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def throughput(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from peft import LoraConfig, get_peft_model

    from whale_lab.models import build_tiny_random, load_model_and_tokenizer
    from whale_lab.weights.sft import sft_pass

    if args.hidden or args.layers:
        folder = Path(tempfile.gettempdir()) / f"whale-bench-{args.hidden or 64}x{args.layers or 2}"
        name = str(build_tiny_random(folder, hidden=args.hidden or 64, layers=args.layers or 2))
    else:
        name = args.model
    base, tok = load_model_and_tokenizer(name, dtype=args.dtype, device=args.device)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    ours = get_peft_model(copy.deepcopy(base), lora)
    plain = get_peft_model(copy.deepcopy(base), lora)
    plain.load_state_dict(ours.state_dict())
    vocab = int(base.config.vocab_size)
    examples = _examples(
        args.examples,
        vocab,
        (args.prefix // 2, args.prefix),
        (args.target // 2, args.target),
        args.seed,
    )
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    # The same minibatches for both: sft_pass shuffles with `seed`; reproduce its order.
    order = list(examples)
    random.Random(args.seed).shuffle(order)
    batches = [order[i : i + args.minibatch] for i in range(0, len(order), args.minibatch)]
    tokens = sum(len(e) for e in examples)
    opt_ours = torch.optim.AdamW([p for p in ours.parameters() if p.requires_grad], lr=1e-4)
    opt_plain = torch.optim.AdamW([p for p in plain.parameters() if p.requires_grad], lr=1e-4)
    t_ours: list[float] = []
    t_plain: list[float] = []
    for rep in range(args.repeats + 1):  # the first round warms both up and is not counted
        _sync(args.device)
        t0 = time.perf_counter()
        sft_pass(
            ours,
            opt_ours,
            examples,
            minibatch_size=args.minibatch,
            max_grad_norm=1.0,
            pad_id=pad,
            seed=args.seed,
        )
        _sync(args.device)
        t1 = time.perf_counter()
        _plain_peft_pass(plain, opt_plain, batches, pad, 1.0, args.device)
        _sync(args.device)
        t2 = time.perf_counter()
        if rep:
            t_ours.append(t1 - t0)
            t_plain.append(t2 - t1)
    ours_tps = tokens / statistics.median(t_ours)
    plain_tps = tokens / statistics.median(t_plain)
    return {
        "model": name,
        "device": args.device,
        "examples": len(examples),
        "tokens_per_pass": tokens,
        "target_tokens_per_pass": sum(e.n_target for e in examples),
        "minibatch": args.minibatch,
        "repeats": args.repeats,
        "rsft_tokens_per_s": round(ours_tps, 1),
        "plain_peft_tokens_per_s": round(plain_tps, 1),
        "ratio": round(ours_tps / plain_tps, 3),
    }


def visibility(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds from 'update done' to 'the backend generates with it', per backend."""
    from whale_lab.backends import make_backend
    from whale_lab.backends.base import SamplingParams
    from whale_lab.config import config_from_dict
    from whale_lab.context import RunContext
    from whale_lab.store import RunStore
    from whale_lab.trace import EpisodeTrace, TurnRecord
    from whale_lab.weights.rsft import RsftPhase

    sys.path.insert(0, str(REPO / "tests"))
    from rsft_support import ParityDomain

    greedy = SamplingParams(temperature=0.0, top_k=0, max_new_tokens=8)
    probe = [[{"role": "user", "content": f"probe {i}"}] for i in range(4)]
    trace = EpisodeTrace(
        task_id="t",
        domain="parity",
        sample=0,
        harness="h",
        turns=[
            TurnRecord(
                prompt=probe[0],
                response="an answer to learn",
                finish_reason="stop",
                prompt_tokens=0,
                completion_tokens=0,
            )
        ],
        reward=1.0,
    )
    base_cfg = {
        "model": {"path": args.model, "device": args.device, "dtype": args.dtype},
        "rsft": {"learning_rate": 0.05},
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config_from_dict(base_cfg)
        backend = make_backend(cfg)
        phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(Path(tmp) / "hf")))
        before = [g.token_ids for g in backend.generate(probe, greedy)]
        phase.update([trace] * 8)
        t0 = time.perf_counter()
        phase.publish()
        after = [g.token_ids for g in backend.generate(probe, greedy)]
        out["hf_publish_s"] = round(phase.last_publish_seconds, 6)
        out["hf_first_generate_after_update_s"] = round(time.perf_counter() - t0, 4)
        out["hf_output_changed"] = after != before

        server = None
        base_url = args.base_url
        if not base_url:
            from adapter_server import AdapterServer

            from whale_lab.models import resolve_model_path

            server = AdapterServer(resolve_model_path(args.model), served_name="base").start()
            base_url = server.base_url
        try:
            cfg = config_from_dict(
                {
                    **base_cfg,
                    "model": {
                        **base_cfg["model"],
                        "backend": "openai",
                        "base_url": base_url,
                        "served_model": args.served_model or "base",
                    },
                }
            )
            backend = make_backend(cfg)
            phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(Path(tmp) / "openai")))
            before_text = [g.text for g in backend.generate(probe, greedy)]
            times = []
            for i in range(args.publish_repeats):
                phase.update([trace] * 8, seed=i)
                phase.step += 1
                phase.publish()
                times.append(phase.last_publish_seconds)
            after_text = [g.text for g in backend.generate(probe, greedy)]
            out["openai_save_and_load_adapter_s"] = round(statistics.median(times), 4)
            out["openai_output_changed"] = after_text != before_text
            out["openai_server"] = "local adapter server" if server else base_url
            backend.close()
        finally:
            if server is not None:
                server.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-random", help="preset, folder or hub id")
    ap.add_argument("--hidden", type=int, default=0, help="build a random Llama of this width")
    ap.add_argument("--layers", type=int, default=0, help="... and this many layers")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--examples", type=int, default=64)
    ap.add_argument("--minibatch", type=int, default=16)
    ap.add_argument("--prefix", type=int, default=160, help="longest masked prefix (tokens)")
    ap.add_argument("--target", type=int, default=64, help="longest target (tokens)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--publish-repeats", type=int, default=5)
    ap.add_argument("--base-url", default="", help="a vLLM server (--enable-lora) to publish to")
    ap.add_argument("--served-model", default="", help="the model name that server serves")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    result = {"throughput": throughput(args), "visibility": visibility(args)}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    t, v = result["throughput"], result["visibility"]
    print(
        f"model {t['model']} on {t['device']}: {t['examples']} examples, "
        f"{t['tokens_per_pass']} tokens per pass ({t['target_tokens_per_pass']} carry loss), "
        f"minibatch {t['minibatch']}, median of {t['repeats']} passes"
    )
    print(f"  RSFT update      {t['rsft_tokens_per_s']:>12,.0f} tokens/s")
    print(f"  plain peft loop  {t['plain_peft_tokens_per_s']:>12,.0f} tokens/s")
    print(f"  ratio            {t['ratio']:>12.3f}   (target >= 0.9)")
    print("new weights visible to the backend:")
    print(
        f"  hf      in place: publish {v['hf_publish_s']:.6f} s; first generate after the "
        f"update {v['hf_first_generate_after_update_s']:.3f} s; output changed: "
        f"{v['hf_output_changed']}"
    )
    print(
        f"  openai  save adapter + load_adapter: {v['openai_save_and_load_adapter_s']:.3f} s "
        f"(median, {v['openai_server']}); output changed: {v['openai_output_changed']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
