"""A stand-in for the `vllm` package, backed by a real transformers model, for CPU tests.

It speaks the slice of vLLM's offline API that `backends/vllm.py` uses (`LLM(...)`, `chat` with
per-prompt `SamplingParams`, `LoRARequest`, `llm_engine.remove_lora`, `sleep`/`wake_up`,
`reset_prefix_cache`, `collective_rpc` with a callable run on each "worker"), and it behaves the
way vLLM does where a bug would hide: LoRA adapters are cached by their integer id (a reused id
serves the cached copy), a sleeping engine refuses to generate, and `collective_rpc` hands the
callable a worker whose `model_runner.model.load_weights` copies tensors by transformers name.
Generation runs the model in process, so the served-policy check measures real log-probabilities.
"""

from __future__ import annotations

import copy
import sys
import types
import warnings
from dataclasses import dataclass, field
from typing import Any

from whale_lab.backends.base import SamplingParams as WhaleParams
from whale_lab.backends.hf import HFBackend
from whale_lab.models import load_model_and_tokenizer


def SamplingParams(**kw: Any) -> types.SimpleNamespace:  # noqa: N802 - vLLM's name
    return types.SimpleNamespace(**kw)


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str


@dataclass
class Record:
    """What the engine was asked to do, in order."""

    init: dict[str, Any] = field(default_factory=dict)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    template_kwargs: list[dict[str, Any]] = field(default_factory=list)


class _Loader:
    """The worker's model as `collective_rpc` callables see it (`model_runner.model`)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def load_weights(self, weights: Any) -> set[str]:
        import torch

        state = self.model.state_dict()
        loaded = set()
        with torch.no_grad():
            for name, tensor in weights:
                if name not in state:
                    raise KeyError(f"no parameter {name!r} in the model")
                state[name].copy_(tensor.to(state[name].dtype))
                loaded.add(name)
        return loaded


class LLM:
    last: LLM | None = None

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.record = Record(init={"model": model, **kwargs})
        self.base, self.tokenizer = load_model_and_tokenizer(model)
        self.loras: dict[int, Any] = {}  # lora_int_id -> a peft model, as vLLM caches them
        self.sleeping = False
        self.llm_engine = self
        LLM.last = self

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    # ------------------------------------------------------------------ LoRA
    def _model_for(self, lora: LoRARequest | None) -> Any:
        if lora is None:
            return self.base
        if lora.lora_int_id not in self.loras:
            from peft import PeftModel

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                self.loras[lora.lora_int_id] = PeftModel.from_pretrained(
                    copy.deepcopy(self.base), lora.lora_path
                )
            self.record.calls.append(("add_lora", lora.lora_int_id))
        return self.loras[lora.lora_int_id]

    def remove_lora(self, lora_id: int) -> bool:
        self.record.calls.append(("remove_lora", lora_id))
        return self.loras.pop(lora_id, None) is not None

    # ------------------------------------------------------------------ memory and weights
    def sleep(self, level: int = 1) -> None:
        self.record.calls.append(("sleep", level))
        self.sleeping = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.record.calls.append(("wake_up", tags))
        self.sleeping = False

    def reset_prefix_cache(self) -> bool:
        self.record.calls.append(("reset_prefix_cache", None))
        return True

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = ()) -> list:
        if self.sleeping:
            raise RuntimeError("the engine is asleep")
        worker = types.SimpleNamespace(
            device="cpu", model_runner=types.SimpleNamespace(model=_Loader(self.base))
        )
        self.record.calls.append(("collective_rpc", getattr(method, "__name__", method)))
        return [method(worker, *args)]

    # ------------------------------------------------------------------ generation
    def chat(
        self,
        messages: list[list[dict[str, str]]],
        sampling_params: list[Any],
        use_tqdm: bool = False,
        lora_request: LoRARequest | None = None,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[Any]:
        if self.sleeping:
            raise RuntimeError("the engine is asleep: wake_up() before generating")
        self.record.calls.append(("chat", lora_request.lora_name if lora_request else None))
        self.record.template_kwargs.append(dict(chat_template_kwargs or {}))
        hf = HFBackend(self._model_for(lora_request), self.tokenizer)
        hf.chat_template_kwargs = dict(chat_template_kwargs or {})
        outs = []
        for conv, sp in zip(messages, sampling_params, strict=True):
            params = WhaleParams(
                temperature=sp.temperature,
                top_p=sp.top_p,
                top_k=max(0, sp.top_k),
                max_new_tokens=sp.max_tokens,
                min_new_tokens=getattr(sp, "min_tokens", 0),
                stop=tuple(sp.stop or ()),
                seed=sp.seed,
                logprobs=sp.logprobs is not None,
            )
            (gen,) = hf.generate([conv], params)
            ids = list(gen.token_ids)
            lps = [
                {t: types.SimpleNamespace(logprob=lp)}
                for t, lp in zip(ids, gen.token_logprobs, strict=False)
            ]
            if gen.finish_reason == "stop":  # vLLM reports the end token among the ids
                ids.append(self.tokenizer.eos_token_id)
                lps.append({self.tokenizer.eos_token_id: types.SimpleNamespace(logprob=-0.1)})
            comp = types.SimpleNamespace(
                text=gen.text,
                token_ids=ids,
                finish_reason=gen.finish_reason,
                stop_reason=None,
                logprobs=lps if sp.logprobs is not None else None,
            )
            outs.append(
                types.SimpleNamespace(prompt_token_ids=hf.encode_chat(conv), outputs=[comp])
            )
        return outs


def install(monkeypatch: Any) -> None:
    """Make `import vllm` and `from vllm.lora.request import LoRARequest` find this module."""
    pkg = types.ModuleType("vllm")
    pkg.LLM = LLM  # type: ignore[attr-defined]
    pkg.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest  # type: ignore[attr-defined]
    for name, mod in (("vllm", pkg), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
