"""The hf backend's generation on a GPU, arm by arm, on the same prompts in one process.

    python benchmarks/hf_generate_arms.py            # CUDA: the gpu_check model (0.44B, bf16)
    python benchmarks/hf_generate_arms.py --dry-run  # a tiny model on the CPU

Arms: the continuous-batching scheduler (its first call, which loads CUDA kernels, and a second),
the same without the prefix cache, the backend's padded path (`continuous = false`: one
`model.generate` per chunk) and one plain `model.generate` call over the left-padded batch (the
bar the scheduler should clear). One run of each, in this order: a diagnostic of where the
backend stands against transformers' own generation, not a paired benchmark.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="a tiny model on the CPU")
    args = ap.parse_args(argv)
    import gpu_check
    import torch
    import transformers

    from whale_lab.backends.base import SamplingParams
    from whale_lab.backends.hf import HFBackend
    from whale_lab.models import load_model_and_tokenizer

    cuda = torch.cuda.is_available() and not args.dry_run
    dev, dt = ("cuda", "bfloat16") if cuda else ("cpu", "float32")
    shape = gpu_check.FULL if cuda else {**gpu_check.TINY, "batch": 16, "new_tokens": 32}
    res: dict[str, Any] = {"device": dev, "dtype": dt, "torch": torch.__version__,
                           "transformers": transformers.__version__}  # fmt: skip

    def timed(name: str, fn: Any) -> None:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        n = fn()
        if cuda:
            torch.cuda.synchronize()
        s = time.perf_counter() - t0
        res[name] = {"seconds": round(s, 3), "tokens": n, "tok_per_s": round(n / s, 1)}

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        gpu_check.build_model(folder, shape, getattr(torch, dt), 0)
        model, tok = load_model_and_tokenizer(str(folder), dtype=dt, device=dev)
        prompts = gpu_check._prompts(shape["batch"])
        sp = SamplingParams(temperature=1.0, top_p=1.0, top_k=20,
                            max_new_tokens=shape["new_tokens"], seed=0)  # fmt: skip
        kw = {"batch_size": shape["batch"], "max_context_tokens": 4096}
        arms = {
            "continuous": HFBackend(model, tok, **kw),
            "continuous_no_prefix_cache": HFBackend(model, tok, prefix_cache_mb=0, **kw),
            "padded": HFBackend(model, tok, continuous=False, **kw),
        }
        res["scheduler"] = "continuous" if arms["continuous"]._supports_refill() else "padded"

        def gen(backend: Any) -> int:
            return sum(g.completion_tokens for g in backend.generate(prompts, sp))

        timed("continuous_first", lambda: gen(arms["continuous"]))
        timed("continuous", lambda: gen(arms["continuous"]))
        timed("continuous_no_prefix_cache", lambda: gen(arms["continuous_no_prefix_cache"]))
        timed("padded", lambda: gen(arms["padded"]))
        enc = [arms["continuous"].encode_chat(p) for p in prompts]
        width = max(len(e) for e in enc)
        pad = int(tok.pad_token_id)
        ids = torch.tensor([[pad] * (width - len(e)) + list(e) for e in enc], device=dev)
        mask = (ids != pad).long()

        def plain() -> int:
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, top_k=20,
                                     top_p=1.0, temperature=1.0, pad_token_id=pad,
                                     max_new_tokens=shape["new_tokens"])  # fmt: skip
            return int((out[:, width:] != pad).sum())

        plain()  # its first call at this shape, as the scheduler's was above
        timed("plain_model_generate", plain)
    res["continuous_vs_plain"] = round(
        res["continuous"]["tok_per_s"] / res["plain_model_generate"]["tok_per_s"], 2
    )
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
