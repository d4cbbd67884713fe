"""Rows kept between calls: an episode's next turn prefills only its new tokens, and computes what a
full prefill computes.

Each check compares a backend that keeps rows with one that keeps none (`prefix_cache_mb=0`) on
multi-turn prompts built the way the rollout engine builds them (the last prompt, the reply, a new
user message), on prompts rewritten by a harness (nothing or less to reuse), after the weights
change in place, and under a memory cap.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from servers import spread_weights

from whale_lab.backends import HFBackend, SamplingParams
from whale_lab.backends.base import BackendError
from whale_lab.backends.hf_prefix_cache import MIN_REUSE, PrefixCache, common_prefix
from whale_lab.models import load_model_and_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)
SAMPLED = SamplingParams(temperature=1.0, top_k=0, max_new_tokens=10, seed=3)
BOARD = "board legal moves FEN e2e4 d7d5 g1f3 b8c6 the position after a long line " * 3


def _first(i: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"Solve puzzle {i}."},
        {"role": "user", "content": f"{BOARD} puzzle {i}"},
    ]


FIRST = [_first(i % 3) for i in range(6)]  # three tasks, two samples each


def _next_turn(prompt: list[dict[str, str]], reply: str) -> list[dict[str, str]]:
    return [
        *prompt,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "illegal move, try again"},
    ]


@pytest.fixture(scope="module")
def model_and_tok(tiny_model_dir: Path) -> tuple:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    return spread_weights(model), tok


def _backend(model_and_tok: tuple, **kw: object) -> HFBackend:
    model, tok = model_and_tok
    return HFBackend(model, tok, **{"batch_size": 8, "max_context_tokens": 1024, **kw})


def _turns(
    backend: HFBackend, params: SamplingParams, n: int = 3, asked: list | None = None
) -> list[list]:
    """`n` turns of the six episodes; each turn's generations (and prompts, into `asked`)."""
    prompts, out = FIRST, []
    for _ in range(n):
        if asked is not None:
            asked.append(prompts)
        gens = backend.generate(prompts, params)
        out.append(gens)
        prompts = [_next_turn(p, g.text) for p, g in zip(prompts, gens, strict=True)]
    return out


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_later_turns_reuse_the_kept_rows_and_compute_the_same(
    model_and_tok: tuple, params: SamplingParams
) -> None:
    kept = _backend(model_and_tok)
    cold = _backend(model_and_tok, prefix_cache_mb=0)
    assert not cold.prefix_cache.enabled
    asked: list = []
    turns = _turns(kept, params, asked=asked)
    assert turns == _turns(cold, params)
    stats = kept.prefix_cache.stats
    # Every distinct prompt of turns 2 and 3 extends its episode's last prompt and reply; the
    # three distinct first-turn prompts find nothing.
    assert stats.hits == stats.lookups - 3 >= 6
    distinct = {str(p): kept.count_tokens(p) for prompts in asked[1:] for p in prompts}
    assert stats.reused_tokens > 0.8 * sum(distinct.values())
    assert len({g.text for gens in turns for g in gens}) > len(FIRST)  # the model reads its prompts
    if params.greedy:  # and each row computes what its prompt computes alone
        prompts = [_next_turn(p, g.text) for p, g in zip(FIRST, turns[0], strict=True)]
        alone = [cold.generate([p], params)[0] for p in prompts]
        assert alone == turns[1]


def test_a_rewritten_context_is_prefilled_in_full(model_and_tok: tuple) -> None:
    kept = _backend(model_and_tok)
    cold = _backend(model_and_tok, prefix_cache_mb=0)
    first = kept.generate(FIRST, GREEDY)
    # A harness that rewrites the system prompt: no kept row shares more than a few tokens.
    rewritten = [
        [
            {"role": "system", "content": "Now a different system prompt."},
            *p[1:],
            {"role": "assistant", "content": g.text},
        ]
        for p, g in zip(FIRST, first, strict=True)
    ]
    hits = kept.prefix_cache.stats.hits
    assert kept.generate(rewritten, GREEDY) == cold.generate(rewritten, GREEDY)
    assert kept.prefix_cache.stats.hits == hits
    # One that edits the last user message: the shared part (the board) is reused, the rest computed.
    edited = [[*p[:-1], {"role": "user", "content": p[-1]["content"] + " (edited)"}] for p in FIRST]
    assert kept.generate(edited, GREEDY) == cold.generate(edited, GREEDY)
    assert kept.prefix_cache.stats.hits > hits


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_weights_changed_in_place_or_an_adapter_switched_off_empty_the_cache(
    model_and_tok: tuple,
) -> None:
    import copy

    from peft import LoraConfig, get_peft_model

    model, tok = model_and_tok
    peft_model = get_peft_model(
        copy.deepcopy(model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)))
    kept = HFBackend(peft_model, tok, batch_size=8, max_context_tokens=1024)
    cold = HFBackend(peft_model, tok, batch_size=8, max_context_tokens=1024, prefix_cache_mb=0)
    before = kept.generate(FIRST, GREEDY)
    assert len(kept.prefix_cache) > 0
    with torch.no_grad():  # an optimizer step in place
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(-3.0)
    after = kept.generate(FIRST, GREEDY)
    assert kept.prefix_cache.stats.cleared == 1
    assert after == cold.generate(FIRST, GREEDY) and after != before
    with peft_model.disable_adapter():  # the base model, as the weight-sync check reads it
        base = kept.generate(FIRST, GREEDY)
        assert base == cold.generate(FIRST, GREEDY)
    assert kept.prefix_cache.stats.cleared == 2
    assert kept.generate(FIRST, GREEDY) == after


def test_memory_is_bounded_and_the_least_recently_used_rows_go_first(model_and_tok: tuple) -> None:
    probe = _backend(model_and_tok)
    probe.generate(FIRST[:1], GREEDY)
    row_bytes = probe.prefix_cache.nbytes
    assert row_bytes > 0
    small = _backend(model_and_tok)
    small.prefix_cache.max_bytes = int(2.5 * row_bytes)  # about two rows
    cold = _backend(model_and_tok, prefix_cache_mb=0)
    assert _turns(small, GREEDY) == _turns(cold, GREEDY)
    assert small.prefix_cache.nbytes <= small.prefix_cache.max_bytes
    assert small.prefix_cache.stats.evicted > 0


def test_lookups_verify_every_token_and_a_longer_row_replaces_the_one_it_extends() -> None:
    store = PrefixCache(1 << 20)
    n = MIN_REUSE * 3

    def kv(length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.arange(length).float()[None, :, None], torch.zeros(1, length, 1))]

    a = list(range(n))
    store.put(a, kv(n))
    assert store.match(a + [1, 2]) is not None and store.match(a + [1, 2])[1] == n
    # Differs in the middle of a block: the match ends exactly where the tokens differ.
    b = a[: MIN_REUSE + 5] + [999] + a[MIN_REUSE + 6 :] + [7]
    assert store.match(b)[1] == MIN_REUSE + 5
    assert store.match([5] + a) is None  # no common start
    assert store.match(a[: MIN_REUSE // 2] + [999] * n) is None  # too little in common
    store.put(a + [1, 2, 3], kv(n + 3))
    assert len(store) == 1  # the longer row covers the shorter
    assert store.match(a)[1] == n - 1  # a prompt keeps one token of its own to compute
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2 and common_prefix([1], [1, 2]) == 1


def test_a_negative_cache_size_is_a_clear_error(model_and_tok: tuple) -> None:
    with pytest.raises(BackendError, match="prefix_cache_mb must be >= 0"):
        _backend(model_and_tok, prefix_cache_mb=-1)


def test_the_padded_path_keeps_nothing(model_and_tok: tuple) -> None:
    padded = _backend(model_and_tok, continuous=False)
    assert _turns(padded, GREEDY, 2) == _turns(_backend(model_and_tok), GREEDY, 2)
    assert len(padded.prefix_cache) == 0
    assert dataclasses.asdict(padded.prefix_cache.stats)["hits"] == 0


def test_a_call_made_while_another_runs_keeps_nothing(model_and_tok: tuple) -> None:
    kept = _backend(model_and_tok)
    cold = _backend(model_and_tok, prefix_cache_mb=0)
    kept.generate(FIRST, GREEDY)
    rows = len(kept.prefix_cache)
    with kept._prefix_lock:  # as if another thread were generating
        second = [_next_turn(p, "x") for p in FIRST]
        assert kept.generate(second, GREEDY) == cold.generate(second, GREEDY)
    assert len(kept.prefix_cache) == rows and kept.prefix_cache.stats.lookups == 3


def test_the_training_window_frees_the_kept_rows_before_an_update(model_and_tok: tuple) -> None:
    """RSFT trains inside `backend.training_window()`: the kept rows would be stale after the
    update, and on a GPU their memory belongs to the SFT pass."""
    kept = _backend(model_and_tok)
    first = kept.generate(FIRST, GREEDY)
    assert len(kept.prefix_cache) > 0
    with kept.training_window():
        assert len(kept.prefix_cache) == 0
    assert kept.generate(FIRST, GREEDY) == first  # nothing changed, so the same replies
