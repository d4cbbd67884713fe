"""Verified weight sync: after every publish the backend generates with the weights just trained,
or the run stops with one line.

The `hf` backend is trained in place (every step verified on the tiny model; a backend that keeps
generating with a copy stops the run). The `openai` backend is run against the adapter server of
`tests/adapter_server.py`, here answering OpenAI `logprobs` (vLLM's "token_id:N" tokens when asked):
once as it is, applying each adapter, and once accepting adapters and ignoring them, which must
stop `whale-lab train` after the first publish with exit code 2. `whale-lab train` preflights the
adapter endpoint (a server without it fails before any rollout) and ends a failed run with
`run_finished` failed; RSFT rollouts over a vLLM server ask for log-probabilities, the only way
its answers carry the sampled ids, so SFT trains on those ids.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from adapter_server import AdapterServer
from rsft_support import ParityDomain, tiny_config, write_harness
from servers import FaultServer, Reply, Request, echo_responder

from whale_lab import cli
from whale_lab.backends import HFBackend, OpenAIBackend, make_backend
from whale_lab.backends.base import BackendError, Generation, Message, SamplingParams
from whale_lab.context import RunContext
from whale_lab.events import RunFinished, WeightStep, event_from_dict
from whale_lab.models import load_model_and_tokenizer
from whale_lab.store import RunStore
from whale_lab.weights.lora import attach
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sync import (
    PROBE_PROMPTS,
    PROBE_TOKENS,
    SYNC_TOLERANCE,
    UNVERIFIED,
    VERIFIED,
    WeightSync,
    WeightSyncError,
    judge,
)

GREEDY_LP = SamplingParams(temperature=0.0, top_k=0, max_new_tokens=8, logprobs=True)
PROMPTS: list[list[Message]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "a longer prompt, so the batch is left-padded"}],
]


# ----------------------------------------------------------------------------- the rule itself


def test_the_rule_verifies_only_a_resolvable_match_with_the_new_weights() -> None:
    new, old = [-1.0, -2.0, -0.5], [-1.5, -2.5, -1.0]
    gap0 = [0.0, 0.0, 0.0]

    status, dist, _ = judge(new, new, old, gap0, gap0, exact_ids=True)
    assert status == VERIFIED and dist["distance"] == 0.0 and dist["previous"] == 0.5

    status, _, cause = judge(old, new, old, gap0, gap0, exact_ids=True)  # serves the previous
    assert (status, cause) == ("mismatch", "stale")

    far = [x - 1.0 for x in new]  # matches neither
    assert judge(far, new, old, gap0, gap0, exact_ids=True)[:3:2] == ("mismatch", "neither")
    # ... but with ids re-encoded from text that could be a re-tokenisation: not a stop
    assert judge(far, new, old, gap0, gap0, exact_ids=False)[0] == UNVERIFIED

    tiny = [x + 1e-6 for x in new]  # an update too small to resolve: never "verified"
    status, _, note = judge(new, new, tiny, gap0, gap0, exact_ids=True)
    assert status == UNVERIFIED and "too little to resolve" in note

    # a bf16-like server: noise 0.02 per token; a 0.1 change is not 10x the noise
    noisy = [x + 0.02 for x in new]
    assert judge(noisy, new, [x - 0.1 for x in new], gap0, gap0, exact_ids=True)[0] == UNVERIFIED
    assert judge(noisy, new, [x - 0.5 for x in new], gap0, gap0, exact_ids=True)[0] == VERIFIED
    assert SYNC_TOLERANCE >= 0.02

    status, _, note = judge(new, new, None, gap0, None, exact_ids=True)
    assert status == UNVERIFIED and "no previous weights" in note


def test_without_logprobs_it_is_unverified_unless_the_tokens_follow_the_old_weights() -> None:
    new, old = [-1.0, -2.0], [-1.5, -2.5]
    status, _, note = judge([], new, old, [0.0, 0.0], [0.4, 0.0], exact_ids=True)
    assert status == UNVERIFIED and note == "the backend returns no logprobs"
    status, _, note = judge([], new, old, [0.0, 0.9], [0.0, 0.0], exact_ids=False)
    assert status == "mismatch" and "follow the previous weights" in note
    assert judge([], [], None, [], None, exact_ids=True)[0] == UNVERIFIED  # empty probes


# ----------------------------------------------------------------------------- hf backend


@pytest.fixture(scope="module")
def lively(tiny_model_dir: Path) -> HFBackend:
    from servers import spread_weights

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    return HFBackend(spread_weights(model), tok, max_context_tokens=512)


def test_hf_logprobs_are_the_raw_model_distribution_of_the_sampled_tokens(lively: HFBackend) -> None:
    for params in (GREEDY_LP, dataclasses.replace(GREEDY_LP, temperature=1.7, top_k=5, seed=3)):
        gens = lively.generate(PROMPTS, params)
        for prompt, g in zip(PROMPTS, gens, strict=True):
            assert len(g.token_logprobs) == len(g.token_ids) > 0
            ids = lively.encode_chat(prompt)
            x = torch.tensor([ids + list(g.token_ids)])
            with torch.no_grad():
                lp = torch.log_softmax(lively.model(x).logits[0].float(), dim=-1)
            ref = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
            # before temperature and top-k: the model's own distribution
            assert max(abs(a - b) for a, b in zip(ref, g.token_logprobs, strict=True)) < 1e-4
    plain = lively.generate(PROMPTS, dataclasses.replace(GREEDY_LP, logprobs=False))
    assert [g.token_ids for g in plain] == [g.token_ids for g in lively.generate(PROMPTS, GREEDY_LP)]
    assert all(g.token_logprobs == () for g in plain)


@contextlib.contextmanager
def ending_at_once(model: Any, eos: int, push: float = 30.0) -> Iterator[None]:
    """The model puts nearly all its mass on EOS at every position (a policy trained on empty
    replies), for generation and scoring alike."""

    def hook(_module: Any, _inputs: Any, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[..., eos] += push
        return logits

    handle = model.get_output_embeddings().register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@pytest.mark.parametrize("continuous", [True, False], ids=["refill", "padded"])
def test_min_new_tokens_bars_the_end_token_and_keeps_the_raw_logprobs(
    lively: HFBackend, continuous: bool
) -> None:
    hf = HFBackend(lively.model, lively.tokenizer, max_context_tokens=512, continuous=continuous)
    eos = hf.tokenizer.eos_token_id
    with ending_at_once(hf.model, eos):
        plain = hf.generate(PROMPTS, GREEDY_LP)
        assert all(g.token_ids == () and g.finish_reason == "stop" for g in plain)
        held = hf.generate(PROMPTS, dataclasses.replace(GREEDY_LP, min_new_tokens=5))
        for prompt, g in zip(PROMPTS, held, strict=True):
            # five tokens, none of them EOS, then the EOS the model wants ends the reply
            assert len(g.token_ids) == 5 and eos not in g.token_ids and g.finish_reason == "stop"
            ids = hf.encode_chat(prompt)
            with torch.no_grad():
                lp = torch.log_softmax(
                    hf.model(torch.tensor([ids + list(g.token_ids)])).logits[0].float(), dim=-1
                )
            ref = [lp[len(ids) - 1 + i, t].item() for i, t in enumerate(g.token_ids)]
            assert max(ref) < -10  # what EOS leaves the rest: the raw distribution, not renormalised
            assert max(abs(a - b) for a, b in zip(ref, g.token_logprobs, strict=True)) < 1e-3
    with pytest.raises(BackendError, match="min_new_tokens must be in"):
        hf.generate(PROMPTS, dataclasses.replace(GREEDY_LP, min_new_tokens=9))


def test_a_policy_that_ends_every_reply_at_once_is_still_verified(tiny_model_dir: Path) -> None:
    """A model trained on empty replies ends every probe at its first token; the probes run to
    their length anyway, so the check still has tokens to compare, and still catches a stale copy."""
    from servers import spread_weights

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    tm = attach(spread_weights(model), tok, tiny_config())
    sync = WeightSync(tm)
    fresh = HFBackend(tm.model, tok, max_context_tokens=512)
    g = torch.Generator().manual_seed(0)

    def update() -> None:
        sync.remember()
        with torch.no_grad():
            for _, p in tm.named_trainable():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)

    with ending_at_once(tm.model, tok.eos_token_id):
        assert all(not x.token_ids for x in fresh.generate(PROBE_PROMPTS, GREEDY_LP))
        update()
        result = sync.check(fresh, served_version="step-1")
        assert result.status == VERIFIED, result
        assert result.tokens == len(PROBE_PROMPTS) * PROBE_TOKENS
        stale = StaleCopyBackend(tm.model, tok)  # keeps the weights of step 1
        update()
        with pytest.raises(WeightSyncError, match="a copy of the previous weights"):
            sync.check(stale, served_version="step-2")


def make_phase(root: Path, cfg: Any = None, backend: Any = None) -> tuple[RsftPhase, list[Any]]:
    cfg = cfg or tiny_config()
    events: list[Any] = []
    store = RunStore(root)

    def emit(event: Any) -> None:
        store.emit(event)
        events.append(event)

    backend = backend if backend is not None else make_backend(cfg)
    return RsftPhase(RunContext.of(cfg, backend, ParityDomain(), store, emit)), events


def test_hf_in_place_every_step_is_verified_and_recorded(tmp_path: Path) -> None:
    phase, events = make_phase(tmp_path / "run")
    result = phase.run(write_harness(tmp_path), epochs=1.0)  # 4 steps
    steps = [e for e in events if isinstance(e, WeightStep)]
    assert len(steps) == 4 and all(s.kept > 0 for s in steps)
    for s in steps:
        assert s.sync == VERIFIED, s
        assert s.served_version == f"step-{s.step}"
        assert s.sync_distance is not None and s.sync_distance < 1e-3
        assert s.reencoded_turns == 0  # the hf backend returns its sampled ids
    assert len({s.fingerprint for s in steps}) == 4 and all(len(s.fingerprint) == 12 for s in steps)
    assert result.history == tuple(steps)
    # the events file holds the same fields; the phase state keeps the last check
    saved = [e for e in RunStore.read_events(tmp_path / "run") if isinstance(e, WeightStep)]
    assert [(e.sync, e.fingerprint) for e in saved] == [(s.sync, s.fingerprint) for s in steps]
    state = phase.state_dict()
    assert state["served_version"] == "step-4" and state["sync"]["status"] == VERIFIED
    assert phase.last_sync is not None and phase.last_sync.seconds > 0


def test_the_ledger_counts_weight_steps_by_sync_outcome_and_survives_a_reopen(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """ledger.json says how many weight steps were verified, unverified or skipped, and the
    last one's outcome; a fresh engine on the folder, and the weight phase's resume point,
    give the same numbers."""
    from engine_support import ApproveAll, engine_config

    from whale_lab.engine.engine import Engine
    from whale_lab.engine.ledger import Ledger
    from whale_lab.seams import CommandChannel

    cfg = engine_config(tmp_path, schedule={"kind": "weight-only", "total_weight_epochs": 0.75})

    def engine(backend: Any = None) -> Engine:
        return Engine(
            cfg, RunStore(tmp_path / "run"), reviewer=ApproveAll(), commands=CommandChannel(),
            backend=backend, domain=ParityDomain(),
        )  # fmt: skip

    engine(NoLogprobsBackend(*load_model_and_tokenizer(str(tiny_model_dir)))).run()
    steps = [e for e in RunStore.read_events(tmp_path / "run") if isinstance(e, WeightStep)]
    assert len(steps) == 3 and {s.sync for s in steps} == {UNVERIFIED}  # no served logprobs
    ledger = Ledger.read(tmp_path / "run")
    assert (ledger.sync_verified, ledger.sync_unverified, ledger.sync_skipped) == (0, 3, 0)
    assert ledger.sync_last == UNVERIFIED
    assert "weight sync: 0 verified, 3 unverified, 0 skipped" in "\n".join(ledger.summary_lines())
    saved = json.loads((tmp_path / "run" / "ledger.json").read_text())
    assert (saved["sync_unverified"], saved["sync_last"]) == (3, UNVERIFIED)
    # rebuilt by a new engine that has not loaded the weight phase: the same counts
    again = engine().ledger()
    assert (again.sync_unverified, again.sync_last) == (3, UNVERIFIED)
    # and by the weight phase from its resume point
    phase, _ = make_phase(tmp_path / "run", cfg)
    assert phase.resume()
    assert phase.sync_counts == {VERIFIED: 0, UNVERIFIED: 3, "skipped": 0}
    assert phase.last_step_sync == UNVERIFIED


def test_weight_step_events_from_before_the_check_still_load() -> None:
    old = {
        "type": "weight_step",
        "ts": 1.0,
        "cycle": 0,
        "step": 1,
        "epoch": 0.25,
        "train_reward": 0.5,
        "accept_rate": 0.5,
        "kept": 4,
        "loss": 1.0,
        "tokens": 10,
        "grad_norm": 0.1,
        "step_seconds": 0.2,
        "rollouts": 8,
    }
    ev = event_from_dict(old)
    assert isinstance(ev, WeightStep) and ev.sync == "" and ev.sync_distance is None


class StaleCopyBackend(HFBackend):
    """Exposes the model RSFT trains, but generates with a copy frozen at the start."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        super().__init__(model, tokenizer)
        self.frozen = copy.deepcopy(model)

    def generate(self, prompts: Sequence[Sequence[Message]], params: SamplingParams) -> list[Generation]:
        live, self.model = self.model, self.frozen
        try:
            return super().generate(prompts, params)
        finally:
            self.model = live


def test_a_backend_that_generates_with_a_copy_stops_after_the_first_update(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cfg = tiny_config()
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    phase, events = make_phase(tmp_path / "run", cfg, StaleCopyBackend(model, tok))
    with pytest.raises(WeightSyncError) as info:
        phase.run(write_harness(tmp_path), epochs=1.0)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("weight sync failed on the hf backend for the weights trained in place")
    assert "nats/token from the new weights" in msg and "from the previous ones" in msg
    assert "a copy of the previous weights" in msg
    assert not [e for e in events if isinstance(e, WeightStep)]  # the step was never recorded


class NoLogprobsBackend(HFBackend):
    """The hf backend as a server without logprobs would answer."""

    def generate(self, prompts: Sequence[Sequence[Message]], params: SamplingParams) -> list[Generation]:
        return [
            dataclasses.replace(g, token_logprobs=())
            for g in super().generate(prompts, dataclasses.replace(params, logprobs=False))
        ]


def test_no_logprobs_or_a_change_too_small_is_unverified_never_verified(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    phase, events = make_phase(tmp_path / "a", backend=NoLogprobsBackend(model, tok))
    phase.run(write_harness(tmp_path), epochs=0.5)
    steps = [e for e in events if isinstance(e, WeightStep)]
    assert [s.sync for s in steps] == [UNVERIFIED, UNVERIFIED]
    assert steps[0].sync_note == "the backend returns no logprobs"
    logs = [e.message for e in events if e.type == "log" and "unverified" in e.message]
    assert len(logs) == 1 and "hf backend" in logs[0]  # said once, not every step

    cfg = tiny_config(rsft={"learning_rate": 1e-9})
    phase, events = make_phase(tmp_path / "b", cfg)
    phase.run(write_harness(tmp_path), epochs=0.5)
    steps = [e for e in events if isinstance(e, WeightStep)]
    assert [s.sync for s in steps] == [UNVERIFIED, UNVERIFIED]
    assert "too little to resolve" in steps[0].sync_note


# ----------------------------------------------------------------------------- vLLM (faked)


def test_vllm_reads_the_sampled_token_logprobs_and_drops_the_end_token() -> None:
    """vLLM is not installed here: its `LLM.chat` answer is faked in vLLM's documented shape."""
    from whale_lab.backends.vllm import VLLMBackend

    def logprob(x: float) -> Any:
        return SimpleNamespace(logprob=x, rank=1, decoded_token="t")

    seen: list[Any] = []

    class FakeLLM:
        def chat(self, convs: Any, sampling_params: Any, **kw: Any) -> list[Any]:
            seen.extend(sampling_params)
            comp = [
                SimpleNamespace(  # stopped on EOS (id 2): vLLM keeps it in token_ids
                    text="ab",
                    token_ids=[5, 6, 2],
                    finish_reason="stop",
                    stop_reason=None,
                    logprobs=[{5: logprob(-0.5)}, {6: logprob(-1.5)}, {2: logprob(-0.1)}],
                ),
                SimpleNamespace(
                    text="abc",
                    token_ids=[5, 6, 7],
                    finish_reason="length",
                    stop_reason=None,
                    logprobs=None,  # asked for none / gave none: unverified upstream
                ),
            ]
            return [SimpleNamespace(prompt_token_ids=[1, 2, 3], outputs=[c]) for c in comp]

    be = object.__new__(VLLMBackend)
    be._vllm = SimpleNamespace(SamplingParams=lambda **kw: SimpleNamespace(**kw))
    be.llm = FakeLLM()
    be.tokenizer = SimpleNamespace(eos_token_id=2)
    be._lora = None
    be.chat_template_kwargs = {}
    a, b = be.generate(PROMPTS, GREEDY_LP)
    assert seen[0].logprobs == 0  # only the sampled token's own log-probability
    assert (a.token_ids, a.token_logprobs, a.completion_tokens) == ((5, 6), (-0.5, -1.5), 2)
    assert (b.token_ids, b.token_logprobs, b.finish_reason) == ((5, 6, 7), (), "length")
    seen.clear()
    be.generate(PROMPTS, dataclasses.replace(GREEDY_LP, logprobs=False))
    assert seen[0].logprobs is None


# ----------------------------------------------------------------------------- a real server


class LogprobServer(AdapterServer):
    """The adapter server answering OpenAI `logprobs` (per token; "token_id:N" tokens when the
    request sets vLLM's `return_tokens_as_token_ids`). With `ignore_adapters` it accepts every
    adapter and keeps generating with the base model: the bug this check exists for. With
    `send_logprobs` off it answers like a server that has none."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        ignore_adapters: bool = False,
        send_logprobs: bool = True,
        **kw: Any,
    ) -> None:
        super().__init__(model_dir, **kw)
        self.ignore_adapters = ignore_adapters
        self.send_logprobs = send_logprobs

    def complete(self, body: dict) -> tuple[int, dict]:
        name = str(body.get("model", ""))
        if name != self.served_name and name not in self.adapters:
            return 404, {"error": {"message": f"The model `{name}` does not exist."}}
        text = self.tokenizer.apply_chat_template(
            body.get("messages"), add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        temperature = float(body.get("temperature", 1.0))
        kwargs: dict[str, Any] = {
            "max_new_tokens": int(body.get("max_tokens") or 16),
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
            "do_sample": temperature > 0,
            "return_dict_in_generate": True,
            "output_logits": True,
        }
        if temperature > 0:
            kwargs.update(temperature=temperature, top_k=0, top_p=float(body.get("top_p", 1.0)))
        with self._lock:
            self.record.chat_models.append(name)
            base = name == self.served_name or self.ignore_adapters
            if base:
                model = self.base
                ctx: Any = self.peft.disable_adapter() if self.peft is not None else _Null()
            else:
                self.peft.set_adapter(self.adapters[name])
                model, ctx = self.peft, _Null()
            with ctx, torch.inference_mode(), torch.random.fork_rng(devices=[]):
                if body.get("seed") is not None:
                    torch.manual_seed(int(body["seed"]))
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        new = out.sequences[0, ids.shape[1] :].tolist()
        lps = [
            torch.log_softmax(step[0].float(), dim=-1)[tok].item()
            for step, tok in zip(out.logits, new, strict=True)
        ]
        finish = "length"
        if self.tokenizer.eos_token_id in new:
            cut = new.index(self.tokenizer.eos_token_id)
            new, lps, finish = new[:cut], lps[:cut], "stop"
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        content = [
            {
                "token": f"token_id:{t}" if as_ids else self.tokenizer.decode([t]),
                "logprob": lp,
                "bytes": None,
                "top_logprobs": [],
            }
            for t, lp in zip(new, lps, strict=True)
        ]
        choice = {
            "index": 0,
            "finish_reason": finish,
            "message": {
                "role": "assistant",
                "content": self.tokenizer.decode(new, skip_special_tokens=True),
            },
            "logprobs": {"content": content} if body.get("logprobs") and self.send_logprobs else None,
        }
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
            "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": len(new)},
        }


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


@pytest.fixture
def applying(tiny_model_dir: Path) -> Iterator[LogprobServer]:
    server = LogprobServer(tiny_model_dir, served_name="tiny").start()
    yield server
    server.stop()


@pytest.fixture
def ignoring(tiny_model_dir: Path) -> Iterator[LogprobServer]:
    server = LogprobServer(tiny_model_dir, served_name="tiny", ignore_adapters=True).start()
    yield server
    server.stop()


def openai_model(server: LogprobServer, model_dir: Path) -> dict[str, Any]:
    return {
        "backend": "openai",
        "path": str(model_dir),
        "base_url": server.base_url,
        "served_model": "tiny",
    }


def test_openai_against_a_server_that_applies_adapters_verifies_every_publish(
    tmp_path: Path, applying: LogprobServer, tiny_model_dir: Path
) -> None:
    cfg = tiny_config(model=openai_model(applying, tiny_model_dir))
    backend = make_backend(cfg)
    try:
        phase, events = make_phase(tmp_path / "run", cfg, backend)
        assert phase.mode == "adapter"
        phase.run(write_harness(tmp_path), epochs=0.5)  # 2 steps
        steps = [e for e in events if isinstance(e, WeightStep)]
        assert len(steps) == 2 and all(s.kept for s in steps)
        # the server answers vLLM's logprobs: every publish is measured, so verified, never less
        for s in steps:
            assert s.sync == VERIFIED, s
            assert s.served_version == f"step-{s.step}"
            assert s.sync_distance is not None and s.sync_distance < 1e-3
        assert backend.active_model == steps[-1].served_version
        probes = len(PROBE_PROMPTS)
        assert applying.record.chat_models[-probes:] == [backend.active_model] * probes
    finally:
        backend.close()


def perturbed_adapter(tiny_model_dir: Path, folder: Path, cfg: Any) -> Path:
    """A LoRA adapter for the tiny model that really changes its outputs."""
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    tm = attach(model, tok, cfg)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in tm.named_trainable():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return tm.save_pretrained(folder)


def train_args(server: Any, model_dir: Path, runs: Path, adapter: Path | None) -> list[str]:
    sets = {
        "run.directory": str(runs),
        "model.backend": "openai",
        "model.path": str(model_dir),
        "model.base_url": server.base_url,
        "model.served_model": "tiny",
        "domain.name": "math",
        "domain.splits": {"weight": 2, "harness": 1, "val": 1, "test": 1},
        "sampling.k": 1,
        "sampling.max_new_tokens": 4,
        "rsft.prompts_per_step": 2,
        "rsft.samples_per_prompt": 1,
        "rsft.epochs": 1.0,
        "rsft.eval_every": 1.0,
    }
    args = ["train", *(["--adapter", str(adapter)] if adapter is not None else [])]
    for key, value in sets.items():
        if isinstance(value, dict):
            value = "{" + ", ".join(f"{k} = {v}" for k, v in value.items()) + "}"
        else:
            value = json.dumps(value)
        args += ["--set", f"{key}={value}"]
    return args


def test_train_against_a_server_that_ignores_adapters_stops_after_the_first_publish(
    tmp_path: Path,
    ignoring: LogprobServer,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    adapter = perturbed_adapter(tiny_model_dir, tmp_path / "adapter", tiny_config())
    code = cli.main(train_args(ignoring, tiny_model_dir, tmp_path / "runs", adapter))
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "weight sync failed on the openai backend for adapter 'step-0'" in err
    assert "generates with the previous weights" in err or "follow the previous weights" in err
    assert [name for name, _ in ignoring.record.loads] == ["step-0"]  # the first publish only
    # only the sync probes ran under the adapter: nothing was evaluated or trained after it
    # (requests for the base name are the backend's own start-up checks)
    after = [m for m in ignoring.record.chat_models if m != "tiny"]
    assert after == ["step-0"] * len(PROBE_PROMPTS)
    (run,) = (tmp_path / "runs").iterdir()
    events = RunStore.read_events(run)
    assert not [e for e in events if e.type in ("weight_step", "eval_result")]
    # the run's events end with the failure, its message the line printed
    last = events[-1]
    assert isinstance(last, RunFinished) and last.status == "failed"
    assert last.message in err and "weight sync failed" in last.message
    assert RunStore(run).read_state()["status"] == "failed"


def no_adapter_endpoint(req: Request) -> Reply:
    """An OpenAI-compatible server without vLLM's runtime LoRA endpoints (404, as vLLM answers
    without --enable-lora); its chat endpoint answers."""
    if req.path.endswith("/load_lora_adapter") or req.path.endswith("/unload_lora_adapter"):
        return Reply(404, {"detail": "Not Found"})
    return echo_responder(req)


def test_train_against_a_server_without_the_adapter_endpoint_stops_before_any_rollout(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with FaultServer() as server:
        server.set_default(no_adapter_endpoint)
        t0 = time.perf_counter()
        code = cli.main(train_args(server, tiny_model_dir, tmp_path / "runs", None))
        seconds = time.perf_counter() - t0
        chats = [r.json for r in server.requests_to("/chat/completions")]
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "does not support runtime LoRA adapters" in err and "--enable-lora" in err
    # only the preflight's one-token request reached the chat endpoint: no baseline, no rollout
    assert chats and all(c["max_tokens"] == 1 for c in chats)
    assert seconds < 60  # in seconds, not after an evaluation and a weight step
    (run,) = (tmp_path / "runs").iterdir()
    events = RunStore.read_events(run)
    (only,) = events
    assert isinstance(only, RunFinished) and only.status == "failed"
    assert "runtime LoRA" in only.message and only.message in err


def test_train_against_a_server_that_applies_adapters_completes(
    tmp_path: Path,
    applying: LogprobServer,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    adapter = perturbed_adapter(tiny_model_dir, tmp_path / "adapter", tiny_config())
    code = cli.main(train_args(applying, tiny_model_dir, tmp_path / "runs", adapter))
    assert code == 0, capsys.readouterr().err
    (run,) = (tmp_path / "runs").iterdir()
    steps = [e for e in RunStore.read_events(run) if isinstance(e, WeightStep)]
    # the tiny model never solves math: no update, so nothing new is published after step-0
    assert steps and all(s.sync == "skipped" and s.served_version == "step-0" for s in steps)
    assert [name for name, _ in applying.record.loads] == ["step-0"]


def test_run_train_where_every_step_publishes_verifies_every_weight_step(
    tmp_path: Path,
    applying: LogprobServer,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Done-when, with reward the tiny model can earn: `ParityDomain` (about half of its
    replies are accepted) stands in the domain registry for math, so every step updates and
    publishes, and every weight_step of the command must record a verified sync."""
    from whale_lab.commands.train import run_train
    from whale_lab.domains import DOMAINS

    monkeypatch.setitem(DOMAINS, "math", lambda cfg: ParityDomain())
    cfg = tiny_config(
        model=openai_model(applying, tiny_model_dir),
        run={"directory": str(tmp_path / "runs")},
        domain={"harness": str(write_harness(tmp_path))},
        rsft={"epochs": 0.75},  # 3 steps of 2 prompts x 4 samples
    )
    assert run_train(cfg, run_dir=tmp_path / "run", progress=False) == 0, capsys.readouterr().err
    events = RunStore.read_events(tmp_path / "run")
    steps = [e for e in events if isinstance(e, WeightStep)]
    assert [s.step for s in steps] == [1, 2, 3]
    for s in steps:
        assert s.kept > 0 and s.sync == VERIFIED, s
        assert s.served_version == f"step-{s.step}" and len(s.fingerprint) == 12
        assert s.sync_distance is not None and s.sync_distance < 1e-3
    assert [name for name, _ in applying.record.loads] == ["step-1", "step-2", "step-3"]
    assert isinstance(events[-1], RunFinished) and events[-1].status == "completed"


class SampledIdsServer(LogprobServer):
    """The logprob server, keeping each RSFT rollout's request and sampled ids (not the checks')."""

    def __init__(self, model_dir: str | Path, **kw: Any) -> None:
        super().__init__(model_dir, **kw)
        self.sampled: list[tuple[int, ...]] = []
        self.bodies: list[dict] = []

    def complete(self, body: dict) -> tuple[int, dict]:
        status, answer = super().complete(body)
        if str(body["messages"][-1]["content"]).startswith("say weight"):  # a rollout
            self.bodies.append(body)
            content = (answer["choices"][0]["logprobs"] or {}).get("content") or []
            self.sampled.append(tuple(int(c["token"].split(":")[1]) for c in content))
        return status, answer


@pytest.mark.parametrize("kind", ["vllm", "openai"])
def test_rsft_over_a_vllm_server_trains_on_the_sampled_ids(
    tmp_path: Path, tiny_model_dir: Path, kind: str
) -> None:
    """Over vLLM the ids come back only with logprobs: RSFT rollouts ask for them there, and
    SFT's targets are the ids the server sampled (nothing re-encoded). Over a server of unknown
    kind they are not asked for, and the re-encoding is counted."""
    from collections import Counter

    from whale_lab.store import read_jsonl
    from whale_lab.trace import EpisodeTrace
    from whale_lab.weights.sft import build_examples

    server = SampledIdsServer(tiny_model_dir, served_name="tiny").start()
    cfg = tiny_config(model=openai_model(server, tiny_model_dir))
    backend = make_backend(cfg)
    assert isinstance(backend, OpenAIBackend) and backend.verify
    backend.server_kind = kind  # what preflight would learn from a vLLM server's /v1/models
    try:
        phase, events = make_phase(tmp_path / "run", cfg, backend)
        phase.run(write_harness(tmp_path), epochs=0.25)  # one step, 8 rollouts
    finally:
        backend.close()
        server.stop()
    (step,) = [e for e in events if isinstance(e, WeightStep)]
    assert step.kept > 0 and len(server.bodies) == 8
    assert all(bool(b.get("logprobs")) == (kind == "vllm") for b in server.bodies)
    if kind == "openai":
        assert step.reencoded_turns == step.kept
        return
    assert step.reencoded_turns == 0 and step.sync == VERIFIED
    traces = [EpisodeTrace.from_dict(r) for r in read_jsonl(tmp_path / "run/traces/weight.jsonl")]
    turns = [turn for t in traces for turn in t.turns]
    assert Counter(tuple(t.token_ids or ()) for t in turns) == Counter(server.sampled)
    kept = [t for t in traces if t.reward > cfg.rsft.accept_threshold]
    examples = build_examples(kept, phase.tm.tokenizer, eos_id=phase.eos_id)
    assert len(examples) == step.kept and not any(e.reencoded for e in examples)
    for ex, trace in zip(examples, kept, strict=True):
        (turn,) = trace.turns
        want = list(turn.token_ids or ()) + ([phase.eos_id] if turn.finish_reason == "stop" else [])
        assert [t for t in ex.labels if t != -100] == want


def test_without_logprobs_a_server_ignoring_adapters_is_caught_by_its_greedy_tokens(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """No logprobs, no ids: the text is re-encoded, and tokens greedy under the previous weights
    but not under the new ones still stop the run."""
    server = LogprobServer(
        tiny_model_dir, served_name="tiny", ignore_adapters=True, send_logprobs=False
    ).start()
    cfg = tiny_config(model=openai_model(server, tiny_model_dir))
    backend = make_backend(cfg)
    try:
        adapter = perturbed_adapter(tiny_model_dir, tmp_path / "adapter", cfg)
        store = RunStore(tmp_path / "run")
        phase = RsftPhase(
            RunContext.of(cfg, backend, ParityDomain(), store), init_adapter=adapter
        )
        with pytest.raises(WeightSyncError, match="follow the previous weights") as info:
            phase.run(write_harness(tmp_path), epochs=0.25)
        assert "adapter 'step-0'" in str(info.value) and "no served log-probabilities" in str(
            info.value
        )
    finally:
        backend.close()
        server.stop()
