"""What `rsft.launcher = "accelerate"` costs per SFT pass against the pass in process.

Both arms train the same examples (every turn of a few synthetic trajectories on the micro model,
LoRA, minibatches of 2 trajectories) from the same starting weights, alternating over rounds in
one process. The accelerate arm starts `--processes` workers (DDP over gloo without CUDA), which
load the model and the job each pass, so its cost is mostly that fixed start; the ratio says how
large a step must be before it pays. Times: CPU seconds of this process and its children
(`resource.getrusage`), and wall seconds beside them.

    OMP_NUM_THREADS=1 python benchmarks/accelerate_cost.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _summary(xs: list[float]) -> dict[str, float]:
    return {"min": round(min(xs), 3), "median": round(statistics.median(xs), 3),
            "max": round(max(xs), 3)}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--trajectories", type=int, default=16)
    args = ap.parse_args()

    import torch

    from whale_lab.config import config_from_dict
    from whale_lab.models import load_model_and_tokenizer
    from whale_lab.weights.distributed import DistributedTrainer
    from whale_lab.weights.lora import attach
    from whale_lab.weights.sft import IGNORE_INDEX, SftExample, sft_pass

    cfg = config_from_dict({
        "model": {"path": "micro", "lora": {"rank": 8}},
        "rsft": {"learning_rate": 1e-3, "minibatch_size": 2, "minibatch_unit": "trajectories",
                 "launcher": "accelerate", "processes": args.processes},
    })  # fmt: skip

    def fresh() -> tuple:
        model, tok = load_model_and_tokenizer("micro")
        tm = attach(model, tok, cfg)
        return tm, torch.optim.AdamW(tm.parameters(), lr=1e-3), tok

    one, opt1, tok = fresh()
    two, opt2, _ = fresh()
    examples = []
    for t in range(args.trajectories):
        for turn in range(2):
            p = tok(f"Question {t}.{turn}: what is {t} + {turn}?", add_special_tokens=False)
            r = tok(f"It is {t + turn}.", add_special_tokens=False)["input_ids"] + [
                tok.eos_token_id
            ]
            ids = p["input_ids"]
            examples.append(SftExample(tuple(ids + r), tuple([IGNORE_INDEX] * len(ids) + r), "t",
                                       False, t))  # fmt: skip
    cpu = {"single": [], "accelerate": []}
    wall = {"single": [], "accelerate": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = DistributedTrainer(cfg, Path(tmp) / "job")
        for r in range(args.rounds):
            order = ("single", "accelerate") if r % 2 == 0 else ("accelerate", "single")
            for arm in order:
                c0, w0 = _cpu(), time.perf_counter()
                if arm == "single":
                    sft_pass(one.model, opt1, examples, minibatch_size=2, max_grad_norm=1.0,
                             pad_id=int(tok.pad_token_id), params=one.parameters(), seed=r,
                             minibatch_unit="trajectories")  # fmt: skip
                else:
                    trainer.pass_(two, opt2, examples, seed=r)
                cpu[arm].append(_cpu() - c0)
                wall[arm].append(time.perf_counter() - w0)
    ratios = [a / s for a, s in zip(cpu["accelerate"], cpu["single"], strict=True)]
    print(json.dumps({
        "processes": args.processes, "examples": len(examples), "rounds": args.rounds,
        "cpu_s": {k: _summary(v) for k, v in cpu.items()},
        "wall_s": {k: _summary(v) for k, v in wall.items()},
        "accelerate_over_single_cpu": _summary(ratios),
        "extra_wall_s_per_pass": round(statistics.median(wall["accelerate"])
                                       - statistics.median(wall["single"]), 2),
    }, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
