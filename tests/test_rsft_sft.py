"""SFT on accepted rollouts: masking, the accept rule, the empty batch, token-mean loss, weights I/O."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from whale_lab.config import Config, LoraConfig, ModelConfig, RsftConfig
from whale_lab.models import load_model_and_tokenizer
from whale_lab.trace import EpisodeTrace, TurnRecord
from whale_lab.weights.checkpoint import (
    Checkpointer,
    CheckpointError,
    load_optimizer,
    load_trainable,
    save_optimizer,
    save_trainable,
)
from whale_lab.weights.lora import WeightsError, attach, load_adapter_weights
from whale_lab.weights.sft import (
    IGNORE_INDEX,
    SftExample,
    accept,
    build_examples,
    collate,
    enable_checkpointing,
    render_prefix,
    sft_pass,
    sum_nll,
)


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    return load_model_and_tokenizer("tiny-random")


def fresh_lora(tiny: tuple[Any, Any], rank: int = 4) -> Any:
    model, tok = tiny
    cfg = Config(model=ModelConfig(lora=LoraConfig(rank=rank)))
    torch.manual_seed(0)  # LoRA's A matrices are drawn from the global generator
    return attach(copy.deepcopy(model), tok, cfg)


def two_turn_trace(reward: float = 1.0) -> EpisodeTrace:
    sys_msg = {"role": "system", "content": "SYSTEM TEXT"}
    turn1 = TurnRecord(
        prompt=[sys_msg, {"role": "user", "content": "What is 2+2?"}],
        response="<python>2+2</python>",
        finish_reason="stop",
        prompt_tokens=0,
        completion_tokens=0,
    )
    turn2 = TurnRecord(
        prompt=[
            sys_msg,
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<python>2+2</python>"},
            {"role": "user", "content": "TOOL OUTPUT 4"},
        ],
        response="the answer is \\boxed{4}",
        finish_reason="length",
        prompt_tokens=0,
        completion_tokens=0,
    )
    broken = TurnRecord(
        prompt=[sys_msg], response="", finish_reason="error", prompt_tokens=0, completion_tokens=0
    )
    return EpisodeTrace(
        task_id="t1",
        domain="math",
        sample=0,
        harness="h0",
        turns=[turn1, turn2, broken],
        reward=reward,
    )


def test_only_model_generated_tokens_carry_loss(tiny: tuple[Any, Any]) -> None:
    _, tok = tiny
    trace = two_turn_trace()
    examples = build_examples([trace], tok)
    assert len(examples) == 2  # the errored turn teaches nothing
    eos = tok.eos_token_id
    for ex, turn in zip(examples, trace.turns[:2], strict=True):
        prefix = render_prefix(tok, turn.prompt)
        n_prefix = len(prefix)
        assert list(ex.input_ids[:n_prefix]) == prefix
        assert all(x == IGNORE_INDEX for x in ex.labels[:n_prefix])  # system/user/tool masked
        target = [x for x in ex.labels if x != IGNORE_INDEX]
        assert list(ex.labels[n_prefix:]) == target == list(ex.input_ids[n_prefix:])
        if turn.finish_reason == "stop":
            assert target[-1] == eos
            assert tok.decode(target[:-1]) == turn.response
        else:  # cut by the length limit: no end token to learn
            assert eos not in target
            assert tok.decode(target) == turn.response
        masked_text = tok.decode(list(ex.input_ids[:n_prefix]))
        assert "SYSTEM TEXT" in masked_text and "SYSTEM TEXT" not in tok.decode(target)
    assert "TOOL OUTPUT" not in tok.decode([x for x in examples[1].labels if x != IGNORE_INDEX])


def test_loss_is_the_token_mean_nll_over_targets_only(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    examples = build_examples([two_turn_trace()], tok)
    batch = collate(examples, tok.pad_token_id)
    assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()
    nll, n = sum_nll(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    total, count = 0.0, 0
    for row, ex in enumerate(examples):
        for pos in range(1, len(ex)):
            if ex.labels[pos] != IGNORE_INDEX:
                logp = torch.log_softmax(logits[row, pos - 1].float(), -1)[ex.labels[pos]]
                total -= float(logp.detach())
                count += 1
    assert n == count == sum(e.n_target for e in examples)
    assert float(nll.detach()) == pytest.approx(total, rel=1e-5)


def test_accept_rule_is_strictly_above_threshold() -> None:
    traces = [two_turn_trace(r) for r in (0.0, 0.5, 0.51, 1.0)]
    assert [t.reward for t in accept(traces, 0.5)] == [0.51, 1.0]
    assert accept(traces, 1.0) == []


def test_empty_batch_means_no_update(tiny: tuple[Any, Any]) -> None:
    tm = fresh_lora(tiny)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in tm.named_trainable()}
    stats = sft_pass(tm.model, opt, [], minibatch_size=4, max_grad_norm=1.0, pad_id=0)
    assert stats.loss is None and stats.tokens == 0 and stats.minibatches == 0
    assert stats.grad_norm is None
    assert all(torch.equal(before[n], p) for n, p in tm.named_trainable())
    assert opt.state_dict()["state"] == {}


def test_a_pass_lowers_the_loss_and_only_touches_trainable_weights(tiny: tuple[Any, Any]) -> None:
    tm = fresh_lora(tiny)
    _, tok = tiny
    frozen = {n: p.detach().clone() for n, p in tm.model.named_parameters() if not p.requires_grad}
    examples = build_examples([two_turn_trace()] * 4, tok)
    batch = collate(examples, tok.pad_token_id)

    def loss() -> float:
        with torch.no_grad():
            nll, n = sum_nll(tm.model, batch)
        return float(nll) / n

    start = loss()
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    first = sft_pass(
        tm.model, opt, examples, minibatch_size=2, max_grad_norm=1.0, pad_id=tok.pad_token_id
    )
    for _ in range(3):
        sft_pass(
            tm.model, opt, examples, minibatch_size=2, max_grad_norm=1.0, pad_id=tok.pad_token_id
        )
    assert first.minibatches == 4 and first.examples == 8
    assert first.tokens == sum(e.n_target for e in examples)
    assert first.grad_norm is not None and first.grad_norm > 0
    assert first.loss == pytest.approx(start, rel=0.2)  # the pass reports the training NLL
    assert loss() < start
    for n, p in tm.model.named_parameters():
        if n in frozen:
            assert torch.equal(frozen[n], p), n


def test_chunked_forward_gives_the_same_update(tiny: tuple[Any, Any]) -> None:
    """Splitting a minibatch for memory must not change the token-mean gradient."""
    _, tok = tiny
    examples = build_examples([two_turn_trace()] * 3, tok)
    results = []
    for max_tokens in (100000, 1):  # one forward vs one example per forward
        tm = fresh_lora(tiny)
        with torch.no_grad():
            for p in tm.parameters():  # LoRA B starts at zero; make A and B both matter
                p.copy_(torch.linspace(-0.05, 0.05, p.numel()).reshape(p.shape))
        opt = torch.optim.SGD(tm.parameters(), lr=0.1)
        stats = sft_pass(
            tm.model,
            opt,
            examples,
            minibatch_size=6,
            max_grad_norm=1e9,
            pad_id=tok.pad_token_id,
            max_tokens_per_forward=max_tokens,
        )
        results.append((stats, [p.detach().clone() for p in tm.parameters()]))
    (s1, w1), (s2, w2) = results
    assert s1.loss == pytest.approx(s2.loss, rel=1e-5)
    assert s1.grad_norm == pytest.approx(s2.grad_norm, rel=1e-4)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w1, w2, strict=True))


def test_trainable_weights_and_optimizer_round_trip(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    _, tok = tiny
    tm = fresh_lora(tiny)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    sft_pass(
        tm.model,
        opt,
        build_examples([two_turn_trace()], tok),
        minibatch_size=2,
        max_grad_norm=1.0,
        pad_id=tok.pad_token_id,
    )
    save_trainable(tm, tmp_path / "w.safetensors")
    save_optimizer(opt, tmp_path / "opt.pt")

    other = fresh_lora(tiny)
    opt2 = torch.optim.AdamW(other.parameters(), lr=1e-2)
    load_trainable(other, tmp_path / "w.safetensors")
    load_optimizer(opt2, tmp_path / "opt.pt")
    for (n, a), (_, b) in zip(tm.named_trainable(), other.named_trainable(), strict=True):
        assert torch.equal(a, b), n
    s1, s2 = opt.state_dict()["state"], opt2.state_dict()["state"]
    assert s1.keys() == s2.keys() and len(s1) > 0
    for key in s1:
        assert torch.equal(s1[key]["exp_avg"], s2[key]["exp_avg"])
        assert float(s1[key]["step"]) == float(s2[key]["step"]) == 1.0

    with pytest.raises(CheckpointError, match="shape .*rank changed"):
        load_trainable(fresh_lora(tiny, rank=2), tmp_path / "w.safetensors")
    full = attach(copy.deepcopy(tiny[0]), tiny[1], Config(rsft=RsftConfig(full_finetune=True)))
    with pytest.raises(CheckpointError, match="different trainable weights"):
        load_trainable(full, tmp_path / "w.safetensors")
    (tmp_path / "torn.safetensors").write_bytes(b"\x00\x01garbage")
    with pytest.raises(CheckpointError, match="cannot read"):
        load_trainable(other, tmp_path / "torn.safetensors")


def test_resume_points_are_complete_before_they_are_named(
    tiny: tuple[Any, Any], tmp_path: Path
) -> None:
    tm = fresh_lora(tiny)
    opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
    ck = Checkpointer(tmp_path, keep_resume=2)
    assert ck.latest() is None
    paths = [ck.save_resume(step, tm, opt, {"step": step}) for step in (1, 2, 3)]
    latest = ck.latest()
    assert latest is not None and latest["step"] == 3 and Path(latest["path"]) == paths[-1]
    assert not paths[0].exists() and paths[1].exists()  # pruned to the newest two
    (tmp_path / "resume" / "step-000004-1.tmp999").mkdir()  # a kill mid-save leaves this
    assert ck.latest()["step"] == 3
    state = ck.load_resume(latest["path"], tm, opt)
    assert state == {"step": 3}


def test_adapter_folder_errors_are_clear(tiny: tuple[Any, Any], tmp_path: Path) -> None:
    tm = fresh_lora(tiny)
    with pytest.raises(WeightsError, match="does not exist"):
        load_adapter_weights(tm, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError, match="no adapter_config.json"):
        load_adapter_weights(tm, tmp_path / "empty")
    good = tm.save_pretrained(tmp_path / "good")
    load_adapter_weights(fresh_lora(tiny), good)  # the happy path
    with pytest.raises(WeightsError, match="rank 4, but model.lora.rank is 2"):
        load_adapter_weights(fresh_lora(tiny, rank=2), good)
    (good / "adapter_model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(WeightsError, match="cannot read adapter weights"):
        load_adapter_weights(tm, good)
    cfg = json.loads((good / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj"]
    (good / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightsError, match="targets"):
        load_adapter_weights(tm, good)


def test_unknown_lora_targets_name_the_real_layers(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    cfg = Config(model=ModelConfig(lora=LoraConfig(target_modules=("qkv",))))
    with pytest.raises(WeightsError, match=r"\['qkv'\] not found.*q_proj"):
        attach(copy.deepcopy(model), tok, cfg)


def test_full_finetune_trains_every_weight(tiny: tuple[Any, Any]) -> None:
    model, tok = tiny
    cfg = Config(rsft=RsftConfig(full_finetune=True))
    tm = attach(copy.deepcopy(model), tok, cfg)
    assert not tm.lora
    assert len(tm.parameters()) == len(list(tm.model.parameters()))


def test_gradient_checkpointing_changes_memory_not_the_update() -> None:
    from whale_lab.config import config_from_dict

    cfg = config_from_dict({"model": {"path": "micro", "lora": {"target_modules": "all-linear"}}})
    runs = []
    for checkpointing in (False, True):
        model, tok = load_model_and_tokenizer("micro")
        tm = attach(model, tok, cfg)
        if checkpointing:
            enable_checkpointing(tm)
            assert model.is_activation_checkpointing
        ids = tok("Name three colours: red, green, blue.")["input_ids"]
        ex = [SftExample(tuple(ids), tuple([IGNORE_INDEX] * 3 + ids[3:]))]
        opt = torch.optim.AdamW(tm.parameters(), lr=1e-2)
        stats = sft_pass(tm.model, opt, ex, minibatch_size=1, max_grad_norm=1.0, pad_id=0)
        runs.append((stats, {n: p.detach().clone() for n, p in tm.named_trainable()}))
    (plain, w0), (ckpt, w1) = runs
    assert ckpt.loss == pytest.approx(plain.loss, rel=1e-6)
    assert ckpt.grad_norm == pytest.approx(plain.grad_norm, rel=1e-5)
    assert all(torch.allclose(w0[n], w1[n], atol=1e-6) for n in w0)
