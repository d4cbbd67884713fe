"""Train on what was sampled: traces keep each turn's sampled ids, and SFT targets are those ids.

Re-encoding the response text is not the inverse of decoding on real tokenizers, so a target built
from text can be a sequence the model never produced. The re-encoding fallback is only for turns
recorded without ids, and it is counted and said.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rsft_support import ParityDomain, tiny_config, write_harness

from whale_lab.backends import HFBackend, make_backend
from whale_lab.backends.base import Generation, Message, SamplingParams, prompt_messages
from whale_lab.context import RunContext
from whale_lab.events import Log, WeightStep
from whale_lab.store import RunStore, read_jsonl
from whale_lab.trace import EpisodeTrace, TurnRecord
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sft import build_examples, end_token_id, turn_example
from whale_lab.weights.sync import PROBE_PROMPTS

PROMPT = [{"role": "user", "content": "say weight 0"}]


class Recording(HFBackend):
    """The hf backend, keeping every rollout generation it returned (not the sync probes)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        super().__init__(model, tokenizer)
        self.gens: list[Generation] = []

    def generate(self, prompts: Sequence[Sequence[Message]], params: SamplingParams) -> list[Generation]:
        out = super().generate(prompts, params)
        chats = [prompt_messages(p, "prompt") for p in prompts]
        if chats != [list(p) for p in PROBE_PROMPTS]:
            self.gens.extend(out)
        return out


def targets(example: Any) -> list[int]:
    return [t for t in example.labels if t != -100]


def test_sft_targets_are_the_ids_the_hf_backend_sampled(tmp_path: Path) -> None:
    cfg = tiny_config()
    plain = make_backend(cfg)
    backend = Recording(plain.model, plain.tokenizer)
    events: list[Any] = []
    store = RunStore(tmp_path / "run")
    phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), store, events.append))
    phase.run(write_harness(tmp_path), epochs=0.25)
    (step,) = [e for e in events if isinstance(e, WeightStep)]
    assert step.kept > 0 and step.reencoded_turns == 0 and phase.last_sft is not None
    assert phase.last_sft.reencoded_turns == 0

    traces = [EpisodeTrace.from_dict(r) for r in read_jsonl(tmp_path / "run/traces/weight.jsonl")]
    turns = [turn for t in traces for turn in t.turns]
    assert len(turns) == len(backend.gens) == 8
    # each recorded turn carries exactly the ids one generation sampled
    assert Counter(tuple(t.token_ids or ()) for t in turns) == Counter(
        g.token_ids for g in backend.gens
    )
    assert all(t.token_ids is not None and len(t.token_ids) == t.completion_tokens for t in turns)

    eos = end_token_id(phase.tm.tokenizer)
    examples = build_examples(traces, phase.tm.tokenizer, encode=backend.encode_chat)
    assert len(examples) == len(turns) and not any(e.reencoded for e in examples)
    for ex, turn in zip(examples, turns, strict=True):
        want = list(turn.token_ids or ()) + ([eos] if turn.finish_reason == "stop" else [])
        assert targets(ex) == want
        assert list(ex.input_ids[: len(ex) - len(want)]) == backend.encode_chat(turn.prompt)


def _split_token(tokenizer: Any) -> tuple[list[int], list[int], str]:
    """Ids that decode to a text which re-encodes to other ids (a non-canonical split)."""
    special = set(tokenizer.all_special_ids)

    def enc(s: str) -> list[int]:
        return list(tokenizer(s, add_special_tokens=False)["input_ids"])

    for i in range(len(tokenizer)):
        s = tokenizer.decode([i])
        if i in special or len(s) < 2 or enc(s) != [i]:
            continue
        split = enc(s[:1]) + enc(s[1:])
        if tokenizer.decode(split) == s and split != [i]:
            return split, [i], s
    raise AssertionError("the tokenizer has no multi-character token")


def test_a_sampled_split_the_text_would_re_encode_differently_is_kept(tmp_path: Path) -> None:
    phase = RsftPhase(
        RunContext.of(tiny_config(), make_backend(tiny_config()), ParityDomain(), RunStore(tmp_path))
    )
    tok = phase.tm.tokenizer
    eos = end_token_id(tok)
    sampled, canonical, text = _split_token(tok)

    def turn(ids: list[int] | None, finish: str = "stop") -> TurnRecord:
        return TurnRecord(PROMPT, text, finish, 3, len(sampled), token_ids=ids)

    ex = turn_example(turn(sampled), tok, eos)
    assert ex is not None and targets(ex) == sampled + [eos] and not ex.reencoded
    old = turn_example(turn(None), tok, eos)  # a trace without ids: the text, re-encoded
    assert old is not None and targets(old) == canonical + [eos] and old.reencoded
    cut = turn_example(turn(sampled, "length"), tok, eos)  # cut by the budget: no end token
    assert cut is not None and targets(cut) == sampled
    kept_end = turn_example(turn(sampled + [eos]), tok, eos)  # a backend that kept the end token
    assert kept_end is not None and targets(kept_end) == sampled + [eos]


def test_turns_without_ids_are_re_encoded_counted_and_said_once(tmp_path: Path) -> None:
    events: list[Any] = []
    cfg = tiny_config()
    phase = RsftPhase(
        RunContext.of(cfg, make_backend(cfg), ParityDomain(), RunStore(tmp_path), events.append)
    )
    with_ids = TurnRecord(PROMPT, "ab", "stop", 3, 2, token_ids=[70, 71])
    without = TurnRecord(PROMPT, "ab", "stop", 3, 2)
    trace = EpisodeTrace("t", "parity", 0, "h", turns=[with_ids, without, without], reward=1.0)
    for _ in range(2):
        stats = phase.update([trace])
        assert (stats.examples, stats.reencoded_turns) == (3, 2)
    notes = [e.message for e in events if isinstance(e, Log) and "re-encoded" in e.message]
    assert len(notes) == 1 and "2 of 3" in notes[0] and "hf backend" in notes[0]


def test_traces_store_token_ids_only_when_there_are_some() -> None:
    with_ids = TurnRecord(PROMPT, "ab", "stop", 3, 2, token_ids=[70, 71])
    without = TurnRecord(PROMPT, "ab", "stop", 3, 2)
    trace = EpisodeTrace("t", "parity", 0, "h", turns=[with_ids, without])
    d = trace.to_dict()
    assert d["turns"][0]["token_ids"] == [70, 71] and "token_ids" not in d["turns"][1]
    back = EpisodeTrace.from_dict(d)
    assert back.turns[0].token_ids == [70, 71] and back.turns[1].token_ids is None
    assert back.to_dict() == d
