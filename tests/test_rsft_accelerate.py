"""`rsft.launcher = "accelerate"`: the SFT pass in two data-parallel processes (DDP over gloo on
this CPU) gives the same loss and the same updated weights as one process on the same global
batch, for LoRA and for full fine-tuning, and the optimizer state survives the round trip (a
second pass still matches). Minibatches are counted in trajectories; one of them holds a single
turn, so one process has nothing of it and must still join the gradient sync."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from whale_lab.config import config_from_dict
from whale_lab.models import load_model_and_tokenizer
from whale_lab.weights.distributed import DistributedTrainer, launch_command
from whale_lab.weights.lora import attach
from whale_lab.weights.sft import IGNORE_INDEX, SftExample, minibatches, sft_pass

TURNS = (  # (trajectory, prompt, reply)
    (0, "What is 2 + 3?", "The answer is 5."),
    (0, "Are you sure?", "Yes: 2 + 3 = 5."),
    (1, "Name a colour.", "Blue."),
    (2, "Say hello.", "Hello there, how are you today?"),
    (2, "Again.", "Hello!"),
    (2, "Once more.", "Hi."),
    (3, "Count to three.", "One, two, three."),
    (4, "Say yes.", "Yes."),
)


def _examples(tok: Any) -> list[SftExample]:
    out = []
    for traj, prompt, reply in TURNS:
        p = tok(prompt, add_special_tokens=False)["input_ids"]
        r = tok(reply, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        out.append(SftExample(tuple(p + r), tuple([IGNORE_INDEX] * len(p) + r), "t", False, traj))
    return out


def _cfg(full: bool) -> Any:
    return config_from_dict(
        {
            "model": {"path": "micro", "lora": {"rank": 4, "alpha": 8.0}},
            "rsft": {
                "full_finetune": full,
                "learning_rate": 1e-2,
                "minibatch_size": 2,
                "minibatch_unit": "trajectories",
                "launcher": "accelerate",
                "processes": 2,
            },
        }
    )


def _fresh(cfg: Any) -> tuple[Any, Any, Any]:
    import torch

    model, tok = load_model_and_tokenizer("micro")
    tm = attach(model, tok, cfg)
    opt = torch.optim.AdamW(tm.parameters(), lr=cfg.rsft.learning_rate, weight_decay=0.0)
    return tm, opt, tok


@pytest.mark.parametrize("full", [False, True], ids=["lora-ddp", "full-ddp"])
def test_two_processes_match_one_on_the_same_global_batch(tmp_path: Path, full: bool) -> None:
    cfg = _cfg(full)
    one, one_opt, tok = _fresh(cfg)
    two, two_opt, _ = _fresh(cfg)
    examples = _examples(tok)
    sizes = [len(mb) for mb in minibatches(examples, 2, "trajectories", seed=3)]
    assert 1 in sizes  # a minibatch of one turn: the second process has none of it
    trainer = DistributedTrainer(cfg, tmp_path / "job")
    for seed in (3, 4):  # the second pass runs on the optimizer state the first one left
        start = {n: p.detach().clone() for n, p in one.named_trainable()}
        single = sft_pass(
            one.model, one_opt, examples, minibatch_size=2, max_grad_norm=1.0,
            pad_id=tok.pad_token_id, params=one.parameters(), seed=seed,
            minibatch_unit="trajectories",
        )  # fmt: skip
        dist = trainer.pass_(two, two_opt, examples, seed=seed)
        assert dist.minibatches == single.minibatches == 3 and dist.tokens == single.tokens
        assert dist.input_tokens == single.input_tokens
        assert dist.loss == pytest.approx(single.loss, rel=1e-5)
        assert dist.grad_norm == pytest.approx(single.grad_norm, rel=1e-4)
        a, b = dict(one.named_trainable()), dict(two.named_trainable())
        assert set(a) == set(b)
        # Adam divides by the gradient's running size, so entries whose gradient is round-off
        # (LoRA's A while B is still zero) move by up to lr in either process: compare the
        # whole update by its norm, not entry by entry.
        update = sum(float((a[n] - start[n]).detach().pow(2).sum()) for n in a) ** 0.5
        apart = sum(float((a[n] - b[n]).detach().pow(2).sum()) for n in a) ** 0.5
        assert update > 1e-3  # the pass moved the weights
        assert apart < 1e-3 * update, (apart, update)


def test_the_launch_command_uses_accelerate_on_cuda_and_torchrun_without() -> None:
    job = Path("/tmp/job")
    cpu = launch_command(job, 2, cuda=False, fsdp=False, port=1234)
    assert cpu[1:3] == ["-m", "torch.distributed.run"] and "--nproc_per_node" in cpu
    ddp = launch_command(job, 4, cuda=True, fsdp=False, port=1234)
    assert ddp[1:3] == ["-m", "accelerate.commands.launch"] and "--multi_gpu" in ddp
    fsdp = launch_command(job, 4, cuda=True, fsdp=True, port=1234)
    assert "--use_fsdp" in fsdp and "--multi_gpu" not in fsdp
    assert fsdp[-3:] == ["-m", "whale_lab.weights.dist_worker", str(job)]


def test_a_weight_step_trains_in_the_workers_and_serves_the_result(tmp_path: Path) -> None:
    from rsft_support import ParityDomain, tiny_config, write_harness

    from whale_lab.backends import make_backend
    from whale_lab.context import RunContext
    from whale_lab.store import RunStore
    from whale_lab.weights.rsft import RsftPhase
    from whale_lab.weights.sync import VERIFIED

    cfg = tiny_config(rsft={"launcher": "accelerate", "processes": 2})
    backend = make_backend(cfg)
    phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(tmp_path / "run")))
    (step,) = phase.run(write_harness(tmp_path), epochs=0.25).history
    assert step.kept > 0 and step.loss is not None
    assert step.sync == VERIFIED  # the hf backend generates with what the workers trained
    assert (tmp_path / "run" / "weights" / "dist-job" / "out" / "stats.json").exists()
