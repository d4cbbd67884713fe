"""Continuous batching in the hf backend: the refill scheduler computes what generation alone does.

Every check compares the scheduler with one prompt generated at a time and with the padded path
(`continuous=False`, one `model.generate` per chunk), on prompts built so that rows join and leave
mid-decode, identical prompts are prefilled once and prompts with a long common prefix share it.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch
from servers import spread_weights

from whale_lab.backends import HFBackend, SamplingParams
from whale_lab.backends.hf_batching import (
    MIN_SHARED_PREFIX,
    Sampler,
    _buckets,
    _share_groups,
    cache_kwarg,
    supports_refill,
)
from whale_lab.models import load_model_and_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
SAMPLED = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=12, seed=11)

BOARD = "board legal moves FEN e2e4 d7d5 the answer is a longer tail here " * 3


def _task(i: int, reply: str) -> list[dict[str, str]]:
    """A second-turn prompt: a long shared first turn, then a reply of its own."""
    return [
        {"role": "system", "content": f"Solve puzzle {i}. {BOARD}"},
        {"role": "user", "content": BOARD},
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "illegal move, try again"},
    ]


# Two tasks' samples (shared prefixes), an exact duplicate, and short unrelated prompts.
MIXED = [
    _task(1, "<move>e2e4</move>"),
    [{"role": "user", "content": "hi"}],
    _task(1, "I think d2d4"),
    _task(2, "x"),
    [{"role": "user", "content": "2 + 3 = ?"}],
    _task(1, "<move>e2e4</move>"),
    _task(2, "search python whale"),
    [{"role": "user", "content": "x"}],
    _task(1, "a much longer reply that goes on and on about the position " * 2),
]


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> HFBackend:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    return HFBackend(spread_weights(model), tok, batch_size=64, max_context_tokens=512)


def _like(backend: HFBackend, **kw: object) -> HFBackend:
    args: dict = {"batch_size": backend.batch_size, "max_context_tokens": backend.max_context_tokens}
    args.update(kw)
    return HFBackend(backend.model, backend.tokenizer, **args)


def test_the_prompts_exercise_sharing_and_the_model_takes_the_scheduler(backend: HFBackend) -> None:
    assert supports_refill(backend.model)
    unique = [list(p) for p in dict.fromkeys(tuple(backend.encode_chat(m)) for m in MIXED)]
    assert len(unique) < len(MIXED)  # an exact duplicate
    groups = _share_groups(unique)
    assert groups and all(n >= MIN_SHARED_PREFIX and len(m) > 1 for n, m in groups)


def test_greedy_equals_sequential_and_the_padded_path(backend: HFBackend) -> None:
    batched = backend.generate(MIXED, GREEDY)
    alone = [backend.generate([p], GREEDY)[0] for p in MIXED]
    assert batched == alone
    assert _like(backend, continuous=False).generate(MIXED, GREEDY) == batched
    # Two rows in flight: rows leave and waiting prompts join all the way through.
    small = _like(backend, batch_size=2, refill=1)
    assert small.generate(MIXED, GREEDY) == batched
    assert small.decode_stats.prefills > len(MIXED) // 2
    assert len({g.text for g in batched}) > len(MIXED) // 2  # the model reads its prompts


def test_rows_join_and_leave_with_their_own_budgets(backend: HFBackend) -> None:
    lengths = [backend.count_tokens(p) for p in MIXED]
    ctx = sorted(lengths)[-2] + 6  # the longest prompt is refused; long ones get a few tokens
    tight = _like(backend, batch_size=3, refill=1, max_context_tokens=ctx)
    params = dataclasses.replace(GREEDY, max_new_tokens=20)
    gens = tight.generate(MIXED, params)
    padded = _like(backend, batch_size=3, max_context_tokens=ctx, continuous=False)
    assert gens == padded.generate(MIXED, params)
    assert gens == [tight.generate([p], params)[0] for p in MIXED]
    for n, g in zip(lengths, gens, strict=True):
        if n >= ctx:
            assert g.finish_reason == "error" and "context limit" in g.error
            continue
        budget = min(params.max_new_tokens, ctx - n)
        assert g.completion_tokens <= budget
        if g.finish_reason == "length":
            assert g.completion_tokens == budget
    assert {g.completion_tokens for g in gens if g.finish_reason == "length"} >= {6, 20}
    # A row leaves at once and a waiting prompt takes its slot: no decode slot carries padding,
    # where the padded path runs each chunk to its longest row.
    assert tight.decode_stats.slot_use == 1.0
    assert padded.decode_stats.slot_use < 1.0


def test_stop_strings_end_rows_early_as_on_the_padded_path(backend: HFBackend) -> None:
    full = backend.generate(MIXED, dataclasses.replace(GREEDY, max_new_tokens=24))
    stops = []
    for g in full:  # a plain ASCII pair a few characters into some replies
        text = g.text
        pair = next((text[i : i + 2] for i in range(3, len(text) - 2)
                     if text[i : i + 2].isascii() and text[i : i + 2].isalnum()), None)
        if pair:
            stops.append(pair)
    params = dataclasses.replace(GREEDY, max_new_tokens=24, stop=(*stops[:3], "\x00never"))
    gens = backend.generate(MIXED, params)
    assert gens == _like(backend, continuous=False).generate(MIXED, params)
    assert gens == [backend.generate([p], params)[0] for p in MIXED]
    cut = [g for g, f in zip(gens, full, strict=True) if len(g.token_ids) < len(f.token_ids)]
    assert cut and all(g.finish_reason == "stop" for g in cut)
    for g, f in zip(gens, full, strict=True):
        assert f.token_ids[: len(g.token_ids)] == g.token_ids
        assert f.text.startswith(g.text)


def test_eos_ends_a_row_without_the_eos_token(backend: HFBackend) -> None:
    first = backend.generate(MIXED, GREEDY)
    cfg = backend.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = [old, first[0].token_ids[3]]
    try:
        gens = backend.generate(MIXED, GREEDY)
        assert gens == _like(backend, continuous=False).generate(MIXED, GREEDY)
    finally:
        cfg.eos_token_id = old
    assert gens[0].finish_reason == "stop"
    assert gens[0].token_ids == first[0].token_ids[: first[0].token_ids.index(first[0].token_ids[3])]


def test_logprobs_are_the_raw_distribution_on_every_prefill_path(backend: HFBackend) -> None:
    for params in (dataclasses.replace(GREEDY, logprobs=True),
                   dataclasses.replace(SAMPLED, temperature=1.7, top_k=5, logprobs=True)):
        gens = backend.generate(MIXED, params)
        for prompt, g in zip(MIXED, gens, strict=True):
            assert len(g.token_logprobs) == len(g.token_ids) > 0
            ids = backend.encode_chat(prompt)
            with torch.no_grad():
                lp = torch.log_softmax(
                    backend.model(torch.tensor([ids + list(g.token_ids)])).logits[0].float(), dim=-1
                )
            ref = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
            assert max(abs(a - b) for a, b in zip(ref, g.token_logprobs, strict=True)) < 1e-4
    greedy = dataclasses.replace(GREEDY, logprobs=True)
    padded = _like(backend, continuous=False).generate(MIXED, greedy)
    for a, b in zip(backend.generate(MIXED, greedy), padded, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.token_logprobs, b.token_logprobs, strict=True)) < 1e-5


def test_seeded_samples_do_not_depend_on_the_rest_of_the_batch(backend: HFBackend) -> None:
    a = backend.generate(MIXED, SAMPLED)
    assert a == backend.generate(MIXED, SAMPLED)  # reproducible
    # Other prompts around it, another batch size, rows joining at other times: same samples.
    others = [MIXED[0], [{"role": "user", "content": "something else entirely"}], *MIXED[2:]]
    b = backend.generate(others, SAMPLED)
    assert [g for j, g in enumerate(b) if j != 1] == [g for j, g in enumerate(a) if j != 1]
    assert _like(backend, batch_size=1).generate(MIXED, SAMPLED) == a
    assert _like(backend, batch_size=3, refill=2).generate(MIXED, SAMPLED) == a
    # The same prompt twice in one call gets two samples; another seed gives others.
    assert MIXED[0] == MIXED[5] and a[0].token_ids != a[5].token_ids
    c = backend.generate(MIXED, dataclasses.replace(SAMPLED, seed=12))
    assert [g.token_ids for g in c] != [g.token_ids for g in a]
    # Unseeded sampling draws from torch's global RNG, so the caller's seed reproduces it.
    unseeded = dataclasses.replace(SAMPLED, seed=None)
    torch.manual_seed(5)
    x = backend.generate(MIXED, unseeded)
    torch.manual_seed(5)
    assert backend.generate(MIXED, unseeded) == x


def test_the_sampler_draws_from_the_warped_distribution() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    n = 20000
    rows = logits.expand(n, -1).clone()
    rngs = [random.Random(f"t:{i}") for i in range(n)]
    for temperature, top_k, top_p in ((1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 2, 1.0), (1.0, 0, 0.8)):
        want = torch.softmax(logits / temperature, dim=-1)
        if top_k:
            want[torch.argsort(want, descending=True)[top_k:]] = 0.0
        if top_p < 1.0:  # the smallest set of top tokens whose mass reaches top_p
            order = torch.argsort(want, descending=True)
            mass = torch.cumsum(want[order], 0)
            want[order[int((mass < top_p).sum()) + 1 :]] = 0.0
        want = want / want.sum()
        picks = Sampler(temperature, top_k, top_p).pick(rows, rngs)
        got = torch.bincount(picks, minlength=len(logits)).float() / n
        assert torch.all(got[want == 0] == 0), (temperature, top_k, top_p, got)
        assert torch.allclose(got, want, atol=0.015), (temperature, top_k, top_p, got, want)
    assert torch.equal(Sampler(0.0, 20, 1.0).pick(rows[:3], [None] * 3), torch.zeros(3).long())


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_attached_and_trained_in_place(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    peft_model = get_peft_model(
        spread_weights(model),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.1),
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    backend = HFBackend(peft_model, tok, batch_size=4, max_context_tokens=512)
    assert supports_refill(peft_model)
    peft_model.train()  # as RSFT leaves it: generation must run in eval mode, then restore it
    gens = backend.generate(MIXED, GREEDY)
    assert peft_model.training
    assert gens == _like(backend, continuous=False).generate(MIXED, GREEDY)
    assert gens == [backend.generate([p], GREEDY)[0] for p in MIXED]
    sampled = backend.generate(MIXED, SAMPLED)
    assert sampled == backend.generate(MIXED, SAMPLED)  # no dropout while generating
    with torch.no_grad():  # an optimizer step in place: the next call reads the new weights
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    after = backend.generate(MIXED, GREEDY)
    assert [g.token_ids for g in after] != [g.token_ids for g in gens]
    assert after == _like(backend, continuous=False).generate(MIXED, GREEDY)


def test_a_model_the_scheduler_does_not_cover_takes_the_padded_path(backend: HFBackend) -> None:
    model = copy.deepcopy(backend.model)
    model.generation_config.repetition_penalty = 1.5
    assert not supports_refill(model)
    penalised = HFBackend(model, backend.tokenizer, max_context_tokens=512)
    gens = penalised.generate(MIXED, GREEDY)
    forced = HFBackend(model, backend.tokenizer, max_context_tokens=512, continuous=False)
    assert gens == forced.generate(MIXED, GREEDY)
    assert [g.token_ids for g in gens] != [g.token_ids for g in backend.generate(MIXED, GREEDY)]


def test_a_model_that_takes_its_cache_as_past_key_values_takes_the_scheduler(
    backend: HFBackend,
) -> None:
    """transformers before the rename (5.17, as on CUDA images) calls the cache `past_key_values`;
    passed as `cache` there it was ignored, so the scheduler must use the model's own name."""
    model = copy.deepcopy(backend.model)
    current = type(model)

    def forward(
        self: object,
        input_ids: object = None,
        attention_mask: object = None,
        position_ids: object = None,
        past_key_values: object = None,
        use_cache: object = None,
        logits_to_keep: object = 0,
        **kw: object,
    ) -> object:
        if past_key_values is not None:
            kw["cache"] = past_key_values
        return current.forward(  # type: ignore[call-arg]
            self, input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=use_cache, logits_to_keep=logits_to_keep, **kw,
        )  # fmt: skip

    model.__class__ = type("OlderNames", (current,), {"forward": forward})
    assert cache_kwarg(backend.model) == "cache"
    assert cache_kwarg(model) == "past_key_values"
    assert supports_refill(model)
    old = HFBackend(model, backend.tokenizer, batch_size=2, refill=1, max_context_tokens=512)
    assert old.generate(MIXED, GREEDY) == backend.generate(MIXED, GREEDY)
    assert old.decode_stats.prefills > len(MIXED) // 2  # rows joined mid-decode: the scheduler ran


def test_prefix_groups_and_length_buckets() -> None:
    head = list(range(100, 100 + MIN_SHARED_PREFIX + 8))
    rows = [head + [1, 2], [7] * 50, head + [3], head + [4, 5, 6], head[:10] + [9] * 40]
    groups = _share_groups(rows)
    assert groups == [(len(head), [0, 2, 3])]
    # A short common prefix is not shared; every member keeps a token of its own.
    assert _share_groups([[1] * 10 + [2], [1] * 10 + [3]]) == []
    assert _share_groups([head, head + [1]]) == [(len(head) - 1, [0, 1])]
    assert _buckets([0, 1, 2, 3, 4], [400, 390, 200, 199, 10]) == [[0, 1], [2, 3], [4]]
    assert sorted(i for b in _buckets(list(range(9)), [5, 9, 1, 7, 3, 8, 2, 6, 4]) for i in b) \
        == list(range(9))
    assert math.isclose(sum(len(b) for b in _buckets([1, 2], [64, 1])), 2)
