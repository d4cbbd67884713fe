"""The in-process transformers backend on the tiny random model: batching, sampling, stops, LoRA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from servers import spread_weights

from whale_lab.backends import BackendError, HFBackend, SamplingParams, make_backend
from whale_lab.config import Config, ModelConfig, SamplingConfig
from whale_lab.models import load_model_and_tokenizer

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)

PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Solve the problem."}, {"role": "user", "content": "2 + 3 = ?"}],
    [
        {
            "role": "user",
            "content": "the answer is board legal moves FEN e2e4 and a longer tail here",
        }
    ],
    [{"role": "user", "content": "x"}],
    [
        {"role": "user", "content": "search python"},
        {"role": "assistant", "content": "<search>whale</search>"},
        {"role": "user", "content": "passage: result"},
    ],
]


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path) -> HFBackend:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    return HFBackend(spread_weights(model), tok, batch_size=64, max_context_tokens=512)


def test_greedy_is_deterministic_and_prompt_dependent(backend: HFBackend) -> None:
    a = backend.generate(PROMPTS, GREEDY)
    b = backend.generate(PROMPTS, GREEDY)
    assert a == b
    assert len({g.text for g in a}) == len(PROMPTS)  # the model really reads its prompt
    for g, p in zip(a, PROMPTS, strict=True):
        assert g.prompt_tokens == backend.count_tokens(p)
        assert g.completion_tokens == len(g.token_ids) > 0
        assert g.finish_reason in ("stop", "length")
        assert backend.tokenizer.pad_token_id not in g.token_ids[-1:]  # no trailing padding


def test_batch_equals_one_prompt_at_a_time(backend: HFBackend) -> None:
    batched = backend.generate(PROMPTS, GREEDY)
    alone = [backend.generate([p], GREEDY)[0] for p in PROMPTS]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    assert [g.text for g in batched] == [g.text for g in alone]
    # Chunked batches (2 per generate call, length-sorted) give the same again, in order.
    small = HFBackend(backend.model, backend.tokenizer, batch_size=2, max_context_tokens=512)
    assert small.generate(PROMPTS, GREEDY) == batched


def test_finish_reason_length_and_eos(backend: HFBackend) -> None:
    gens = backend.generate(PROMPTS[:2], SamplingParams(temperature=0.0, max_new_tokens=5))
    assert all(g.finish_reason == "length" and g.completion_tokens == 5 for g in gens)
    # Make a token the model emits early count as EOS (a second EOS id, as Llama-3 chat models
    # have): generation must stop there, without that token in the result.
    first = gens[0].token_ids
    cfg = backend.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = [old, first[2]]
    try:
        g = backend.generate(PROMPTS[:1], SamplingParams(temperature=0.0, max_new_tokens=20))[0]
    finally:
        cfg.eos_token_id = old
    stop_at = first.index(first[2])
    assert g.finish_reason == "stop"
    assert g.token_ids == first[:stop_at]


def test_stop_strings_cut_the_text(backend: HFBackend) -> None:
    full = backend.generate(PROMPTS[2:3], SamplingParams(temperature=0.0, max_new_tokens=20))[0]
    text = full.text
    # A plain ASCII pair that first shows up a few characters in.
    stop = next(
        text[i : i + 2]
        for i in range(3, len(text) - 2)
        if text[i : i + 2].isascii()
        and text[i : i + 2].isalnum()
        and text.find(text[i : i + 2]) == i
    )
    g = backend.generate(
        PROMPTS[2:3], SamplingParams(temperature=0.0, max_new_tokens=20, stop=(stop, "\x00never"))
    )[0]
    assert g.finish_reason == "stop"
    assert g.text == text[: text.index(stop)]
    assert stop in backend.tokenizer.decode(g.token_ids)  # the stop string's tokens were generated
    assert full.token_ids[: len(g.token_ids)] == g.token_ids


def test_seeded_sampling_is_reproducible(backend: HFBackend) -> None:
    params = SamplingParams(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=12, seed=7)
    a = backend.generate(PROMPTS * 2, params)
    b = backend.generate(PROMPTS * 2, params)
    assert a == b
    c = backend.generate(PROMPTS * 2, SamplingParams(**{**params.__dict__, "seed": 8}))
    assert [g.text for g in a] != [g.text for g in c]
    # The same prompt twice in one batch gets two different samples.
    assert a[0].text != a[len(PROMPTS)].text
    # Seeding uses a private RNG: the caller's global torch RNG stream is left alone.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    backend.generate(PROMPTS[:1], params)
    assert torch.equal(torch.rand(3), expected)


def test_prompt_over_the_context_limit_is_a_per_prompt_error(backend: HFBackend) -> None:
    tight = HFBackend(backend.model, backend.tokenizer, batch_size=8, max_context_tokens=24)
    long_prompt = [{"role": "user", "content": "the answer is " * 20}]
    gens = tight.generate(
        [PROMPTS[0], long_prompt], SamplingParams(temperature=0.0, max_new_tokens=50)
    )
    assert gens[1].finish_reason == "error" and "context limit is 24" in gens[1].error
    # The short prompt is cut at the context limit instead.
    assert gens[0].finish_reason == "length"
    assert gens[0].prompt_tokens + gens[0].completion_tokens == 24


def test_bad_input_is_a_clear_error(backend: HFBackend) -> None:
    with pytest.raises(BackendError, match="prompt 1, message 0 .*content must be a string"):
        backend.generate([PROMPTS[0], [{"role": "user", "content": None}]], GREEDY)
    with pytest.raises(BackendError, match="top_p"):
        backend.generate(PROMPTS[:1], SamplingParams(top_p=0.0))
    assert backend.generate([], GREEDY) == []


def test_training_mode_is_restored(backend: HFBackend) -> None:
    backend.model.train()
    try:
        backend.generate(PROMPTS[:1], GREEDY)
        assert backend.model.training
    finally:
        backend.model.eval()


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_lora_attached_and_updated_in_place(tiny_model_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    base = spread_weights(model)
    before = HFBackend(base, tok).generate(PROMPTS, GREEDY)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    )
    backend = HFBackend(peft_model, tok, batch_size=4, max_context_tokens=512)
    # LoRA B starts at zero: the adapter changes nothing yet.
    assert backend.generate(PROMPTS, GREEDY) == before
    # Train in place (as RSFT does) between two calls: the next call sees the new weights.
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 2.0)
    after = backend.generate(PROMPTS, GREEDY)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    assert after == [backend.generate([p], GREEDY)[0] for p in PROMPTS]


def test_make_backend_builds_hf_from_config(tiny_model_dir: Path) -> None:
    cfg = Config(
        model=ModelConfig(path=str(tiny_model_dir), backend="hf", max_context_tokens=256),
        sampling=SamplingConfig(batch_size=3),
    )
    backend = make_backend(cfg)
    assert isinstance(backend, HFBackend)
    assert backend.batch_size == 3 and backend.max_context_tokens == 256
    g = backend.generate(PROMPTS[:2], GREEDY)
    assert len(g) == 2 and all(x.completion_tokens > 0 for x in g)
    # An already-loaded model is reused, not loaded again.
    same = make_backend(cfg, backend.model, backend.tokenizer)
    assert isinstance(same, HFBackend) and same.model is backend.model


def test_the_scheduler_is_configured_by_model_hf_keys(backend: HFBackend) -> None:
    from whale_lab.config import ConfigError, load_config

    default = HFBackend.from_config(Config(), backend.model, backend.tokenizer)
    assert default.continuous and default.refill is None
    assert default.prefix_cache.max_bytes == 1024 * 2**20
    cfg = load_config(
        None, ["model.hf.continuous=false", "model.hf.refill=3", "model.hf.prefix_cache_mb=0"]
    )
    set_ = HFBackend.from_config(cfg, backend.model, backend.tokenizer)
    assert (set_.continuous, set_.refill, set_.prefix_cache.enabled) == (False, 3, False)
    assert set_.generate(PROMPTS, GREEDY) == backend.generate(PROMPTS, GREEDY)
    for override, message in (
        ("model.hf.refill=-1", "model.hf.refill: expected a value >= 0, got -1"),
        ("model.hf.prefix_cache_mb=-5", "model.hf.prefix_cache_mb: expected a value >= 0, got -5"),
        ('model.hf.continuous="yes"', "model.hf.continuous: expected true or false, got 'yes'"),
        ("model.hf.prefix_cache=1", "did you mean 'model.hf.prefix_cache_mb'?"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert message in str(err.value) and "\n" not in str(err.value)


def test_vllm_backend_without_vllm_is_a_clear_error(tiny_model_dir: Path) -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vllm is installed here")
    cfg = Config(model=ModelConfig(path=str(tiny_model_dir), backend="vllm"))
    with pytest.raises(BackendError, match="needs the vllm package"):
        make_backend(cfg)


@pytest.mark.gpu
def test_greedy_batch_equals_sequential_on_cuda(tiny_model_dir: Path) -> None:
    model, tok = load_model_and_tokenizer(str(tiny_model_dir), device="cuda")
    backend = HFBackend(spread_weights(model), tok, device="cuda")
    batched = backend.generate(PROMPTS, GREEDY)
    assert batched == [backend.generate([p], GREEDY)[0] for p in PROMPTS]
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    assert backend.generate(PROMPTS, params) == backend.generate(PROMPTS, params)


def test_backends_import_no_heavy_libraries() -> None:
    code = (
        "import sys, whale_lab.backends, whale_lab.quiet\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'vllm', 'textual') "
        "if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_quiet_libraries_keeps_the_terminal_clean(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import logging
    import warnings

    import transformers.utils.logging as hf_logging

    from whale_lab.quiet import ENV, LOGGERS, quiet_libraries

    for key in ENV:  # whatever quiet_libraries sets is undone after the test
        monkeypatch.delenv(key, raising=False)
    bars_were_on = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    levels = {name: logging.getLogger(name).level for name in LOGGERS}
    hf_logger = logging.getLogger("transformers.generation.utils")

    def noise() -> list[warnings.WarningMessage]:
        """What transformers would show: a progress bar, and a warning from inside the library."""
        with hf_logging.tqdm(total=3, desc="Loading weights") as bar:
            bar.update(3)
        with warnings.catch_warnings(record=True) as shown:
            warnings.warn_explicit(
                "deprecated", FutureWarning, "x.py", 1, module="transformers.modeling_utils"
            )
        return shown

    def bars_on() -> None:
        with warnings.catch_warnings():  # the hub warns when its env var says otherwise
            warnings.simplefilter("ignore")
            hf_logging.enable_progress_bar()

    try:
        bars_on()
        hf_logging.set_verbosity_warning()
        assert len(noise()) == 1 and "Loading weights" in capsys.readouterr().err  # not vacuous
        assert hf_logger.isEnabledFor(logging.WARNING)
        quiet_libraries()
        assert noise() == [] and capsys.readouterr().err == ""
        assert not hf_logger.isEnabledFor(logging.WARNING)
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for libraries imported later
        assert os.environ["TQDM_DISABLE"] == "1"
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars_were_on:
            bars_on()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
