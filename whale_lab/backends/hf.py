"""In-process generation with a transformers model: the default backend, and the one RSFT trains.

The backend holds the very model object that the weight phase updates in place, so every call reads
the current weights. The one thing derived from them kept between calls is finished rows'
keys/values (`hf_prefix_cache`, so an episode's next turn prefills only its new tokens), checked
against a fingerprint of the weights at every call and emptied when they changed. Prompts are rendered
with the tokenizer's chat template and decoded with continuous batching (`hf_batching`): at most
`batch_size` rows in flight, a row leaving as soon as it ends (EOS, stop string, its own token
budget) and a waiting prompt taking its place, so replies of ragged length waste no decode steps.
Results come back in the caller's order. Seeded sampling gives each row its own RNG stream (from the
prompt's own seed, `Prompt.seed`, else from the call's seed and the row's index in the call), so a
row's sample does not depend on the rest of the batch.

Models the scheduler does not cover (`hf_batching.supports_refill`), or `continuous=False`, use
the padded path: prompts sorted by length, left-padded, one `model.generate` per chunk of
`batch_size`, each chunk run to its longest row, one torch RNG seeded for the whole call; when
any prompt carries its own seed, every row there samples from its own stream too (the scheduler's
sampler, run as a logits processor), so a seeded prompt's sample is the same on both paths.

With `SamplingParams.logprobs` each generated token's log-probability comes back too, taken from
the raw logits (before temperature/top-k/top-p), which is what a weight-sync check compares with
the trainer's own forward pass (the padded path holds a chunk's per-step logits for it, so there
it is meant for short probes). `decode_stats` counts how full the decode steps were.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
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
    eos_token_ids,
    prompt_messages,
    prompt_seed,
)
from whale_lab.backends.hf_batching import DecodeStats
from whale_lab.backends.hf_prefix_cache import PrefixCache

# Memory for the keys/values kept between turns: the micro model's 128 chess episodes keep ~130
# MiB (2 KiB a token in float32); a model with 20x the per-token cache needs 20x for the same.
PREFIX_CACHE_MB = 1024

if TYPE_CHECKING:
    from whale_lab.config import Config


class HFBackend:
    """Batched `generate` over a (possibly peft-wrapped) causal LM held in this process."""

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str | None = None,
        batch_size: int = 64,
        max_context_tokens: int = 2048,
        continuous: bool = True,
        refill: int | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        prefix_cache_mb: int = PREFIX_CACHE_MB,
    ) -> None:
        if batch_size < 1:
            raise BackendError(f"batch_size must be >= 1, got {batch_size}")
        if refill is not None and refill < 1:
            raise BackendError(f"refill must be >= 1, got {refill}")
        if prefix_cache_mb < 0:
            raise BackendError(
                f"prefix_cache_mb must be >= 0 (0 turns it off), got {prefix_cache_mb}"
            )
        if max_context_tokens < 2:
            raise BackendError(f"max_context_tokens must be >= 2, got {max_context_tokens}")
        if getattr(tokenizer, "chat_template", None) is None:
            raise BackendError("the tokenizer has no chat template; set tokenizer.chat_template")
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.max_context_tokens = max_context_tokens
        # False: the padded path (one model.generate per chunk) for every model.
        self.continuous = continuous
        # Free slots that let waiting prompts join (one prefill forward and one cache copy each
        # time); None: a quarter of the batch, which measured as fast as any on the micro model
        # while leaving ~5% of slots empty. 1 refills at every step.
        self.refill = refill
        self.decode_stats = DecodeStats()
        # Finished rows' keys/values, so an episode's next turn prefills only its new tokens.
        self.prefix_cache = PrefixCache(prefix_cache_mb * 2**20)
        self._prefix_lock = threading.Lock()  # a call made while another runs keeps nothing
        # Template variables (sampling.chat_template_kwargs, e.g. enable_thinking) in every render.
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if device is not None:
            model.to(device)

    @classmethod
    def from_config(cls, cfg: Config, model: Any = None, tokenizer: Any = None) -> HFBackend:
        """Load `cfg.model.path` (or wrap the given model/tokenizer) with the config's batch sizes."""
        from whale_lab.devices import with_device  # model.device checked before a long load

        cfg = with_device(cfg)
        given = model is not None
        if model is None:
            from whale_lab.models import load_model_and_tokenizer

            model, loaded_tok = load_model_and_tokenizer(
                cfg.model.path, dtype=cfg.model.dtype, device=cfg.model.device
            )
            tokenizer = tokenizer if tokenizer is not None else loaded_tok
        elif tokenizer is None:
            tokenizer = _load_tokenizer(cfg.model.path)
        return cls(
            model,
            tokenizer,
            device=None if given else cfg.model.device,  # a given model stays where it is
            batch_size=cfg.sampling.batch_size,
            max_context_tokens=cfg.model.max_context_tokens,
            chat_template_kwargs=cfg.sampling.chat_template_kwargs,
            continuous=cfg.model.hf.continuous,
            refill=cfg.model.hf.refill or None,
            prefix_cache_mb=cfg.model.hf.prefix_cache_mb,
        )

    # ------------------------------------------------------------------ tokens

    def encode(self, messages: Sequence[Message], *, where: str = "prompt") -> Prompt:
        """The chat rendered and tokenised once; `generate` takes it without encoding it again."""
        msgs = check_messages(messages, where)
        ids = self._render_ids(msgs, where)
        return Prompt(tuple(msgs), len(ids), tuple(ids), encoding=self._encoding())

    def _encoding(self) -> object:
        """What a Prompt's ids depend on besides its messages."""
        return (id(self.tokenizer), repr(sorted(self.chat_template_kwargs.items())))

    def encode_chat(self, messages: Sequence[Message], *, where: str = "prompt") -> list[int]:
        """Token ids of a chat rendered with the generation prompt, exactly as generate sees it."""
        return self._render_ids(check_messages(messages, where), where)

    def _ids_of(self, prompt: PromptLike, where: str) -> list[int]:
        """A Prompt's ids when this backend's encoding made them; the chat encoded otherwise."""
        if isinstance(prompt, Prompt) and prompt.ids and prompt.encoding == self._encoding():
            return list(prompt.ids)
        return self._render_ids(prompt_messages(prompt, where), where)

    def _render_ids(self, msgs: list[dict[str, str]], where: str) -> list[int]:
        try:
            text = self.tokenizer.apply_chat_template(
                msgs, add_generation_prompt=True, tokenize=False, **self.chat_template_kwargs
            )
        except Exception as exc:  # jinja errors from the template (e.g. role order rules)
            raise BackendError(f"{where}: the chat template rejected the messages: {exc}") from None
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def count_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.encode_chat(messages))

    def _eos_ids(self) -> list[int]:
        return eos_token_ids(self.model, self.tokenizer)

    def _pad_id(self, eos_ids: list[int]) -> int:
        pad = self.tokenizer.pad_token_id
        if pad is None:
            pad = getattr(self.model.generation_config, "pad_token_id", None)
        if pad is None:
            if not eos_ids:
                raise BackendError("the tokenizer has neither a pad token nor an EOS token")
            pad = eos_ids[0]
        return int(pad)

    # -------------------------------------------------------------- generation

    def generate(self, prompts: Sequence[PromptLike], params: SamplingParams) -> list[Generation]:
        """One completion per prompt, in order; at most `batch_size` rows decode at once."""
        check_params(params)
        if not prompts:
            return []
        encoded = [self._ids_of(p, f"prompt {i}") for i, p in enumerate(prompts)]
        seeds = [prompt_seed(p) for p in prompts]
        results: list[Generation | None] = [None] * len(encoded)
        todo: list[int] = []
        for i, ids in enumerate(encoded):
            if not ids:
                results[i] = Generation("", 0, 0, "error", error="the prompt renders to no tokens")
            elif len(ids) >= self.max_context_tokens:
                results[i] = Generation(
                    "",
                    len(ids),
                    0,
                    "error",
                    error=f"the prompt takes {len(ids)} tokens; the context limit is "
                    f"{self.max_context_tokens} (model.max_context_tokens)",
                )
            else:
                todo.append(i)
        if todo and self.continuous and self._supports_refill():
            with self._generation_mode(None):
                for i, gen in zip(
                    todo, self._generate_refill(encoded, todo, params, seeds), strict=True
                ):
                    results[i] = gen
            return [r for r in results if r is not None]
        # Longest first, so each chunk holds prompts of similar length (little padding).
        todo.sort(key=lambda i: -len(encoded[i]))
        with self._generation_mode(params.seed):
            # Per-row streams only where a prompt brought its own seed: otherwise as before.
            rngs = (
                self._rngs(len(encoded), params, seeds)
                if any(s is not None for s in seeds)
                else None
            )
            for start in range(0, len(todo), self.batch_size):
                chunk = todo[start : start + self.batch_size]
                gens = self._generate_chunk(
                    [encoded[i] for i in chunk],
                    params,
                    None if rngs is None else [rngs[i] for i in chunk],
                )
                for i, gen in zip(chunk, gens, strict=True):
                    results[i] = gen
        return [r for r in results if r is not None]

    def _supports_refill(self) -> bool:
        """Whether the model (read at every call: RSFT may wrap or swap it) takes the scheduler."""
        from whale_lab.backends.hf_batching import supports_refill

        return supports_refill(self.model)

    def _budget(self, row: Sequence[int], params: SamplingParams) -> int:
        """New tokens a row may take: the request's cap, the context limit, the model's positions."""
        budget = min(params.max_new_tokens, self.max_context_tokens - len(row))
        max_pos = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        if isinstance(max_pos, int):
            budget = min(budget, max_pos - len(row))
        return max(1, budget)

    @staticmethod
    def _rngs(n: int, params: SamplingParams, seeds: Sequence[int | None]) -> list[Any] | None:
        """Each row's sampling stream (None for greedy): its prompt's seed, else the call's."""
        from whale_lab.backends.hf_batching import row_rngs

        return None if params.greedy else row_rngs(n, params.seed, seeds)

    def _generate_refill(
        self,
        encoded: list[list[int]],
        todo: list[int],
        params: SamplingParams,
        seeds: Sequence[int | None] | None = None,
    ) -> list[Generation]:
        """The rows `todo` of `encoded` through the refill scheduler, in the order of `todo`."""
        import torch

        from whale_lab.backends.hf_batching import Request, Sampler, generate_refill

        eos_ids = self._eos_ids()
        pad_id = self._pad_id(eos_ids)
        rngs = self._rngs(len(encoded), params, seeds or [None] * len(encoded))
        requests = [
            Request(encoded[i], self._budget(encoded[i], params), None if rngs is None else rngs[i])
            for i in todo
        ]
        width = min(self.batch_size, len(requests))
        kept = None
        if self.prefix_cache.enabled and self._prefix_lock.acquire(blocking=False):
            kept = self.prefix_cache
        try:
            if kept is not None:
                kept.validate(self.model)
            generate_refill(
                self.model,
                requests,
                width=width,
                pad_id=pad_id,
                eos_ids=set(eos_ids),
                sampler=Sampler(params.temperature, params.top_k, params.top_p),
                stopped=self._stop_check(params.stop) if params.stop else None,
                want_logprobs=params.logprobs,
                refill=self.refill if self.refill is not None else max(1, width // 4),
                stats=self.decode_stats,
                kept=kept,
                min_tokens=params.min_new_tokens,
            )
        except getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError) as exc:
            longest = max(len(r.prompt) for r in requests)
            if kept is not None:  # frees what it holds for the retry
                kept.clear()
            raise BackendError(
                f"out of memory generating {len(requests)} prompts of up to {longest} tokens; "
                f"lower sampling.batch_size (now {self.batch_size}) or model.hf.prefix_cache_mb "
                f"(now {self.prefix_cache.max_bytes // 2**20}): {exc}"
            ) from None
        finally:
            if kept is not None:
                self._prefix_lock.release()
        eos_set = set(eos_ids)
        return [
            self._finish(
                r.prompt,
                r.tokens,
                r.budget,
                eos_set,
                params.stop,
                r.logprobs if params.logprobs else None,
            )
            for r in requests
        ]

    def _stop_check(self, stop: Sequence[str]) -> Callable[[list[int]], bool]:
        """Whether a completion's text now contains a stop string.

        The decoded tail is checked first (cheap, every step) and a hit confirmed on the whole
        text; a tail that misses a stop string only lets the row run on, and `_finish` still cuts
        the result at the first stop string, so the result is the same either way.
        """
        window = max(len(s) for s in stop) + 8

        def stopped(toks: list[int]) -> bool:
            decode = self.tokenizer.decode
            if not cut_at_stop(decode(toks[-window:], skip_special_tokens=True), stop)[1]:
                return False
            return (
                len(toks) <= window or cut_at_stop(decode(toks, skip_special_tokens=True), stop)[1]
            )

        return stopped

    @contextlib.contextmanager
    def _generation_mode(self, seed: int | None) -> Iterator[None]:
        """Eval mode + inference mode (+ a private seeded RNG); the caller's state is restored."""
        import torch

        was_training = bool(self.model.training)
        self.model.eval()
        try:
            with contextlib.ExitStack() as stack:
                if seed is not None:
                    dev = self._model_device()
                    devices = [dev] if dev.type == "cuda" else []
                    stack.enter_context(torch.random.fork_rng(devices=devices))
                    torch.manual_seed(seed)
                stack.enter_context(torch.inference_mode())
                yield
        finally:
            if was_training:
                self.model.train()

    def _model_device(self) -> Any:
        import torch

        try:
            return next(self.model.parameters()).device
        except StopIteration:
            return torch.device(self.device or "cpu")

    def _generate_chunk(
        self, rows: list[list[int]], params: SamplingParams, rngs: list[Any] | None = None
    ) -> list[Generation]:
        """One padded `model.generate` over `rows`; with `rngs` (sampling only), each row samples
        from its own stream (the scheduler's sampler as a logits processor, then a greedy pick)."""
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        eos_ids = self._eos_ids()
        pad_id = self._pad_id(eos_ids)
        width = max(len(r) for r in rows)
        # Each row may use up to the context limit; the chunk runs to the largest budget and each
        # row is cut to its own afterwards. Positions never pass the model's own limit.
        budgets = [min(params.max_new_tokens, self.max_context_tokens - len(r)) for r in rows]
        new_tokens = max(budgets)
        max_pos = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        if isinstance(max_pos, int) and width + new_tokens > max_pos:
            new_tokens = max(1, max_pos - width)
        device = self._model_device()
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for j, r in enumerate(rows):
            input_ids[j, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            attention[j, width - len(r) :] = 1
        sampling: dict[str, Any]
        extra: dict[str, Any] = {"tokenizer": self.tokenizer} if params.stop else {}
        if params.greedy or rngs is not None:
            # transformers' neutral values: sampling flags at their defaults raise no warning.
            sampling = {"do_sample": False, "temperature": 1.0, "top_p": 1.0, "top_k": 50}
            if rngs is not None:  # sampled per row here; transformers' greedy pick takes it
                extra["logits_processor"] = LogitsProcessorList([_RowSampling(params, rngs)])
        else:
            sampling = {
                "do_sample": True,
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,  # 0 switches the top-k filter off
            }
        gen_cfg = GenerationConfig(
            max_new_tokens=new_tokens,
            min_new_tokens=min(params.min_new_tokens, new_tokens) or None,
            eos_token_id=eos_ids or None,
            pad_token_id=pad_id,
            use_cache=True,
            num_return_sequences=1,
            stop_strings=list(params.stop) or None,
            # the raw per-step logits (before any processor) when log-probabilities are asked for
            output_logits=params.logprobs,
            return_dict_in_generate=params.logprobs,
            **sampling,
        )
        try:
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                generation_config=gen_cfg,
                **extra,
            )
        except getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError) as exc:
            raise BackendError(
                f"out of memory generating {len(rows)} prompts of up to {width} tokens; "
                f"lower sampling.batch_size (now {self.batch_size}): {exc}"
            ) from None
        logprobs: list[list[float]] | None = None
        if params.logprobs:
            sequences = out.sequences[:, width:]
            logprobs = _chosen_logprobs(out.logits, sequences).tolist()
            completions = sequences.tolist()
        else:
            completions = out[:, width:].tolist()
        eos_set = set(eos_ids)
        gens = [
            self._finish(
                row, toks, budget, eos_set, params.stop, None if logprobs is None else logprobs[j]
            )
            for j, (row, toks, budget) in enumerate(zip(rows, completions, budgets, strict=True))
        ]
        self._count_padded(completions, gens, eos_set)
        return gens

    def _count_padded(
        self, completions: list[list[int]], gens: list[Generation], eos_set: set[int]
    ) -> None:
        """Decode-slot use of one padded chunk: every row rides every step of the longest one."""
        steps = max(0, max(len(c) for c in completions) - 1)  # the first token is the prefill's
        needed = 0
        for toks, g in zip(completions, gens, strict=True):
            n = g.completion_tokens  # plus the EOS it sampled, a real token too
            n += int(n < len(toks) and toks[n] in eos_set and g.finish_reason == "stop")
            needed += max(0, n - 1)
        self.decode_stats.decode_steps += steps
        self.decode_stats.slots += steps * len(completions)
        self.decode_stats.capacity += steps * len(completions)
        self.decode_stats.tokens += needed
        self.decode_stats.prefills += 1

    def _finish(
        self,
        prompt: list[int],
        toks: list[int],
        budget: int,
        eos_set: set[int],
        stop: Sequence[str],
        logprobs: list[float] | None = None,
    ) -> Generation:
        """Trim one row at EOS / stop string / its budget and say why it ended."""
        toks = toks[:budget]  # the chunk may have run past this row's own budget
        ended = False
        for k, t in enumerate(toks):
            if t in eos_set:
                toks, ended = toks[:k], True
                break
        text = self.tokenizer.decode(toks, skip_special_tokens=True)
        if stop:
            text, hit = cut_at_stop(text, stop)
            if hit:
                toks = self._tokens_through_stop(toks, stop)
                ended = True
        return Generation(
            text=text,
            prompt_tokens=len(prompt),
            completion_tokens=len(toks),
            finish_reason="stop" if ended else "length",
            token_ids=tuple(toks),
            token_logprobs=() if logprobs is None else tuple(logprobs[: len(toks)]),
        )

    def _tokens_through_stop(self, toks: list[int], stop: Sequence[str]) -> list[int]:
        """The shortest prefix of `toks` whose text contains a stop string (the model did write it)."""
        lo, hi = 1, len(toks)
        while lo < hi:
            mid = (lo + hi) // 2
            if cut_at_stop(self.tokenizer.decode(toks[:mid], skip_special_tokens=True), stop)[1]:
                hi = mid
            else:
                lo = mid + 1
        return toks[:lo]

    @contextlib.contextmanager
    def training_window(self) -> Iterator[None]:
        """The kept rows go before the trainer runs: the update makes them stale anyway, and on a
        GPU their memory (up to `model.hf.prefix_cache_mb`) is better spent on the SFT pass."""
        with self._prefix_lock:
            self.prefix_cache.clear()
        yield

    def close(self) -> None:
        """The kept rows go; the model stays, since it belongs to whoever trains it."""
        self.prefix_cache.clear()


class _RowSampling:
    """A logits processor that samples each row from its own RNG, as the refill scheduler does,
    and leaves only that token possible: `model.generate`'s greedy pick then takes it. The
    processors from the model's own generation config run before it."""

    def __init__(self, params: SamplingParams, rngs: Sequence[Any]) -> None:
        from whale_lab.backends.hf_batching import Sampler

        self.sampler = Sampler(params.temperature, params.top_k, params.top_p)
        self.rngs = list(rngs)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        picks = self.sampler.pick(scores.to(dtype=torch.float32), self.rngs)
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, picks[:, None].to(out.device), 0.0)


def _chosen_logprobs(step_logits: Sequence[Any], chosen: Any) -> Any:
    """Log-probability of each chosen token under the raw per-step logits: (rows, steps)."""
    import torch

    cols = [
        torch.log_softmax(logits.float(), dim=-1).gather(-1, chosen[:, i : i + 1].to(logits.device))
        for i, logits in enumerate(step_logits)
    ]
    if not cols:
        return torch.zeros((chosen.shape[0], 0))
    return torch.cat(cols, dim=-1).cpu()


def _load_tokenizer(name: str) -> Any:
    """The tokenizer alone (for a model given without one), set up as the loader sets it up."""
    from transformers import AutoTokenizer

    from whale_lab.presets import resolve_model_path
    from whale_lab.presets.common import CHAT_TEMPLATE

    path = resolve_model_path(name)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        raise BackendError(f"cannot load the tokenizer of {name!r} ({path}): {exc}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if tok.chat_template is None:
        tok.chat_template = CHAT_TEMPLATE
    return tok
