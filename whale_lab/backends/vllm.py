"""In-process vLLM (`vllm.LLM`) for GPU boxes: fast batched sampling, LoRA adapters per request.

vLLM is an optional, GPU-only extra: this module imports it only when the backend is built, and a
missing or unusable install is a `BackendError` that says what to do instead. Weights trained by
RSFT reach vLLM in one of two ways, each followed by the served-policy check (`weights/sync.py`):

* LoRA: `load_adapter(path, name)` registers the folder under a fresh adapter id (vLLM caches
  adapters by id, so a reused id could serve a stale copy) and removes every older adapter from
  vLLM (`remove_lora`), so GPU slots and CPU cache hold only what the run still serves.
* full fine-tuning: `load_weights(path)` sends a safetensors file of the trained weights to every
  worker through `LLM.collective_rpc`, where the model's own `load_weights` (the path vLLM's RLHF
  examples use) copies them in, and the prefix cache is reset so no KV block of the old weights
  is reused.

With `model.vllm.enable_sleep_mode`, `training_window()` puts the engine to sleep (level 1:
weights offloaded to CPU, KV cache freed) for the SFT pass and wakes it after, so the training
copy gets the memory the KV cache held.

Token ids come back without the end token (as the `hf` backend returns them), and with
`SamplingParams.logprobs` each one's log-probability under vLLM's default `raw_logprobs` mode (the
model's distribution before temperature/top-k/top-p), read from the sampled-token entries.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from whale_lab.backends.base import (
    BackendError,
    Generation,
    Message,
    Prompt,
    PromptLike,
    SamplingParams,
    check_messages,
    check_params,
    cut_at_stop,
    prompt_messages,
    row_seed,
)

if TYPE_CHECKING:
    from whale_lab.config import Config

MISSING_VLLM = (
    "model.backend = 'vllm' needs the vllm package, a GPU-only extra: install it on a CUDA "
    "machine with `pip install 'whale-lab[vllm]'`, or use backend 'hf' (in process) or 'openai' "
    "(against a running `vllm serve`)"
)


# vLLM accepts only these values for max_lora_rank.
LORA_RANK_SLOTS = (8, 16, 32, 64, 128, 256, 320, 512)


def _lora_rank_slot(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds adapters of `rank`."""
    for slot in LORA_RANK_SLOTS:
        if rank <= slot:
            return slot
    raise BackendError(
        f"model.lora.rank = {rank} is above vLLM's largest LoRA rank ({LORA_RANK_SLOTS[-1]})"
    )


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise BackendError(f"{MISSING_VLLM} (import failed: {exc})") from None
    return vllm


class VLLMBackend:
    """Batched chat generation with `vllm.LLM.chat`; LoRA adapters through `LoRARequest`."""

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str = "auto",
        max_context_tokens: int = 2048,
        enable_lora: bool = True,
        max_lora_rank: int = 64,
        gpu_memory_utilization: float = 0.85,
        seed: int = 0,
        enable_sleep_mode: bool = False,
        tensor_parallel_size: int = 1,
        enforce_eager: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self._vllm = _import_vllm()
        self.model_path = model_path
        self.max_context_tokens = max_context_tokens
        self.sleep_mode = enable_sleep_mode
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        extra: dict[str, Any] = {"enable_sleep_mode": True} if enable_sleep_mode else {}
        if enable_lora:
            extra["max_lora_rank"] = max_lora_rank
        try:
            self.llm = self._vllm.LLM(
                model=model_path,
                dtype=dtype,
                max_model_len=max_context_tokens,
                enable_lora=enable_lora,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                enforce_eager=enforce_eager,
                seed=seed,
                **extra,
            )
        except Exception as exc:  # no GPU, bad folder, out of memory: vLLM raises many kinds
            raise BackendError(f"vLLM could not start model {model_path!r}: {exc}") from None
        self.tokenizer = self.llm.get_tokenizer()
        self._lora: Any = None
        self._lora_ids = itertools.count(1)
        self.adapters: dict[str, Any] = {}
        self.weight_loads = 0  # full-weight publishes so far
        self.sleeps = 0  # training windows slept through

    @classmethod
    def from_config(cls, cfg: Config, model: Any = None, tokenizer: Any = None) -> VLLMBackend:
        """vLLM over `cfg.model.path` (a preset resolves to its local folder first)."""
        from whale_lab.presets import resolve_model_path

        v = cfg.model.vllm
        return cls(
            resolve_model_path(cfg.model.path),
            dtype=cfg.model.dtype,
            max_context_tokens=cfg.model.max_context_tokens,
            enable_lora=cfg.model.lora.enabled and not cfg.rsft.full_finetune,
            max_lora_rank=_lora_rank_slot(cfg.model.lora.rank),
            gpu_memory_utilization=v.gpu_memory_utilization,
            seed=cfg.run.seed,
            enable_sleep_mode=v.enable_sleep_mode,
            tensor_parallel_size=v.tensor_parallel_size,
            enforce_eager=v.enforce_eager,
            chat_template_kwargs=cfg.sampling.chat_template_kwargs,
        )

    def encode(self, messages: Sequence[Message], *, where: str = "prompt") -> Prompt:
        """The chat rendered and tokenised once here, for the caller's length check."""
        msgs = check_messages(messages, where)
        text = self.tokenizer.apply_chat_template(
            msgs, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
        )
        ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return Prompt(tuple(msgs), len(ids), ids)

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return self.encode(messages).tokens

    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        check_params(params)
        convs = [prompt_messages(p, f"prompt {i}") for i, p in enumerate(prompts)]
        if not convs:
            return []
        sps = [
            self._vllm.SamplingParams(
                n=1,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else -1,
                max_tokens=params.max_new_tokens,
                min_tokens=params.min_new_tokens,
                stop=list(params.stop) or None,
                # the prompt's own seed, else the call's plus its index
                seed=row_seed(p, params, i),
                # 0: no alternatives, only the sampled token's own log-probability
                logprobs=0 if params.logprobs else None,
            )
            for i, p in enumerate(prompts)
        ]
        extra = (
            {"chat_template_kwargs": self.chat_template_kwargs} if self.chat_template_kwargs else {}
        )
        outputs = self.llm.chat(
            convs,
            sampling_params=sps,
            use_tqdm=False,
            lora_request=self._lora,
            add_generation_prompt=True,
            **extra,
        )
        results = []
        end_ids = self._end_ids()
        for out in outputs:
            comp = out.outputs[0]
            text, hit = cut_at_stop(comp.text, params.stop)
            finish = "length" if comp.finish_reason == "length" and not hit else "stop"
            ids = [int(t) for t in comp.token_ids]
            logprobs = _sampled_logprobs(comp, ids) if params.logprobs else []
            # The end token vLLM reports in token_ids is not text the model wrote: drop it, so
            # ids (and what training targets) mean the same as with the hf backend.
            stop_reason = getattr(comp, "stop_reason", None)
            ends = end_ids | ({stop_reason} if isinstance(stop_reason, int) else set())
            if comp.finish_reason == "stop" and ids and ids[-1] in ends:
                ids = ids[:-1]
                logprobs = logprobs[: len(ids)]
            results.append(
                Generation(
                    text=text,
                    prompt_tokens=len(out.prompt_token_ids or ()),
                    completion_tokens=len(ids),
                    finish_reason=finish,
                    token_ids=tuple(ids),
                    token_logprobs=tuple(logprobs),
                )
            )
        return results

    def _end_ids(self) -> set[int]:
        """The tokenizer's end-of-sequence id(s): what vLLM stops on by itself."""
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if isinstance(eos, int):
            return {eos}
        if isinstance(eos, (list, tuple)):
            return {int(e) for e in eos if isinstance(e, int)}
        return set()

    def load_adapter(self, path: str | Path, name: str) -> None:
        """Serve the LoRA adapter in `path` from the next generate on, under a fresh id; every
        other adapter is removed from vLLM (the run serves one policy at a time)."""
        if not (Path(path) / "adapter_config.json").exists():
            raise BackendError(f"{path} is not a LoRA adapter folder (no adapter_config.json)")
        from vllm.lora.request import LoRARequest

        req = LoRARequest(name, next(self._lora_ids), str(path))
        for old in list(self.adapters):
            self.unload_adapter(old)
        self.adapters[name] = req
        self._lora = req

    def load_weights(self, path: str | Path) -> None:
        """Copy the full weights in the safetensors file `path` into every worker's model (names
        as the transformers model has them; vLLM's loader maps and packs them), then drop the
        prefix cache, whose blocks were computed with the old weights."""
        path = Path(path)
        if not path.is_file():
            raise BackendError(f"{path}: no weights file to load into vLLM")
        if self._lora is not None:
            raise BackendError("full weights cannot be loaded while a LoRA adapter is served")
        try:
            counts = self.llm.collective_rpc(load_weights_in_worker, args=(str(path),))
        except Exception as exc:  # a worker that died or refused the names: one line
            raise BackendError(f"vLLM could not load the weights in {path}: {exc}") from None
        if not counts or min(int(c) for c in counts) == 0:
            raise BackendError(f"vLLM loaded no tensor from {path} (workers answered {counts})")
        self.llm.reset_prefix_cache()
        self.weight_loads += 1

    @contextlib.contextmanager
    def training_window(self) -> Iterator[None]:
        """Asleep (level 1) while the trainer runs when sleep mode is on; awake again after,
        even when training fails, so the next rollouts find the engine serving."""
        if not self.sleep_mode:
            yield
            return
        self.llm.reset_prefix_cache()
        self.llm.sleep(level=1)
        self.sleeps += 1
        try:
            yield
        finally:
            self.llm.wake_up()

    def unload_adapter(self, name: str) -> None:
        req = self.adapters.pop(name, None)
        if req is None:
            return
        if self._lora is req:
            self._lora = None
        remove = getattr(getattr(self.llm, "llm_engine", None), "remove_lora", None)
        if remove is not None:
            try:
                remove(req.lora_int_id)
            except Exception:  # already evicted from vLLM's cache: nothing to free
                pass

    def close(self) -> None:
        self.llm = None
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


def load_weights_in_worker(worker: Any, path: str) -> int:
    """Runs inside each vLLM worker (sent by `collective_rpc`): read the file on the worker's own
    device and hand the tensors to the model's loader; the number of tensors read."""
    from safetensors.torch import load_file

    device = getattr(worker, "device", "cpu")
    tensors = load_file(path, device=str(device))
    worker.model_runner.model.load_weights(weights=iter(tensors.items()))
    return len(tensors)


def _sampled_logprobs(comp: Any, ids: Sequence[int]) -> list[float]:
    """Each sampled token's log-probability from a vLLM `CompletionOutput`, or [] when vLLM gave
    none or in a shape this code does not know (the weight-sync check then says `unverified`)."""
    entries = getattr(comp, "logprobs", None)
    if entries is None:
        return []
    out: list[float] = []
    try:
        for i, tok in enumerate(ids):
            entry = entries[i]  # {token_id: Logprob} (a list of dicts, or vLLM's FlatLogprobs)
            value = entry[tok]
            out.append(float(getattr(value, "logprob", value)))
    except (IndexError, KeyError, TypeError, ValueError):
        return []
    return out
