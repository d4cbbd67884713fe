"""Honesty checks of an OpenAI-compatible server, before the first rollout (a mixin of the backend).

`preflight()` lists `/v1/models`, tells vLLM from `transformers serve` (each needs its own fields to
sample), resolves the model name and sends a one-token request, so a wrong name or a refusing
server is one line before any rollout; `check_sampling(params)` draws repeated samples of probe
prompts and stops when a server asked for temperature > 0 returns copies; `preflight(adapters=True)`
also checks that the runtime LoRA endpoint exists.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import httpx

from whale_lab.backends.base import BackendError, SamplingParams
from whale_lab.backends.openai_common import (
    SETUP_STATUSES,
    Unreachable,
    log,
    sampling_key,
    short,
    unreachable_reason,
)

PROBE_PROMPTS = ("Say something.", "2 + 3 = ?")
PROBE_SAMPLES = 4  # per probe prompt
PROBE_TOKENS = 16


def preset_folder(name: str) -> str:
    """The folder a preset name ('micro') stands for, '' for other names: a server that loads
    local folders serves the preset under its path."""
    from whale_lab.presets import PRESETS, resolve_model_path

    if name not in PRESETS:
        return ""
    try:
        return resolve_model_path(name)
    except Exception as exc:  # a preset that cannot be built here: the server may still know it
        log.info("could not resolve preset %r (%s)", name, exc)
        return ""


class ServerChecks:
    """The checks, over the backend's client and settings (mixed into `OpenAIBackend`)."""

    # provided by the backend
    _client: httpx.Client
    base_url: str
    timeout_s: float
    server_label: str

    def preflight(self, adapters: bool = False) -> None:
        """Check, before any rollout, what the run needs of the server; a one-line error if not.

        The model list says which server this is (vLLM and `transformers serve` need different
        fields to sample) and which name to ask for; a one-token request shows the chat endpoint
        answers for that name; `adapters=True` checks the runtime LoRA endpoint exists.
        """
        with self._check_lock:
            listing = self._list_models()
            if not self.server_kind:
                self.server_kind = self._detect_kind(listing)
            name, how = self._resolve_model(listing)
            if self.server_kind == "openai" and not listing:
                # `transformers serve` lists a local folder only once loaded (the probe loaded it).
                kind = self._detect_kind(self._list_models(), ask_version=False)
                if kind != "openai":
                    self.server_kind = kind
            self._use_model(name, how)
            if adapters and getattr(self, "full_weights", False):
                # full fine-tuning publishes through /collective_rpc: a server with it refuses
                # a request without a method (400), one without dev mode answers 404
                self._adapter_call("collective_rpc", {}, root=True)  # type: ignore[attr-defined]
            elif adapters:
                # An empty load request: a server with the endpoint refuses the body (400/422),
                # one without it answers 404/405 (which `_adapter_call` turns into the hint).
                self._adapter_call("load_lora_adapter", {})
            self.preflighted = True

    def _get(self, url: str) -> httpx.Response | None:
        """GET with one attempt; None when the server answers garbage or times out."""
        try:
            return self._client.get(url, timeout=min(self.timeout_s, 10.0))
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(unreachable_reason(exc)) from None
        except httpx.TransportError:
            return None

    def _list_models(self) -> list[dict[str, Any]] | None:
        """The entries of `/v1/models`, or None when the server has no usable listing."""
        resp = self._get(f"{self.base_url}/models")
        if resp is None or resp.status_code != 200:
            return None
        try:
            data = resp.json()
        except ValueError:
            return None
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            return None
        return [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]

    def _detect_kind(
        self, listing: list[dict[str, Any]] | None, *, ask_version: bool = True
    ) -> str:
        """vLLM owns its models ("owned_by": "vllm") and answers /version; `transformers serve`
        adds a "status" (loaded or not) to each entry of its list."""
        entries = listing or []
        if any(e.get("owned_by") == "vllm" for e in entries):
            return "vllm"
        if any(isinstance(e.get("status"), dict) for e in entries):
            return "transformers"
        if ask_version:
            resp = self._get(f"{self.server_root}/version")
            try:
                data = resp.json() if resp is not None and resp.status_code == 200 else None
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("version"), str):
                return "vllm"
        return "openai"

    def _candidates(self) -> list[str]:
        """Names to try, in order: the configured one, its aliases, and a preset's folder."""
        out: list[str] = []
        for name in (self.base_model, *self.aliases):
            folder = preset_folder(name)
            for n in (folder, name):
                if n and n not in out:
                    out.append(n)
        return out

    def _resolve_model(self, listing: list[dict[str, Any]] | None) -> tuple[str, str]:
        """The served model name to use and how it was found: a listed candidate, else one the
        server accepts, else the only model it lists; a one-line error naming what it serves."""
        requested = self.base_model
        names = [e["id"] for e in listing] if listing is not None else None
        candidates = self._candidates()
        if names:
            listed = next((c for c in candidates if c in names), None)
            if listed is not None:
                refusal = self._probe_chat(listed)
                if refusal:
                    raise BackendError(f"{self.server_label} lists model {listed!r} but {refusal}")
                return listed, "listed in /v1/models"
        refusals: dict[str, str] = {}
        for name in candidates:
            refusal = self._probe_chat(name)
            if not refusal:
                return name, "accepted by the server"
            refusals[name] = refusal
        first_refusal = refusals.get(requested) or next(iter(refusals.values()), "")
        bases = [e["id"] for e in listing or [] if not e.get("parent")]
        if len(bases) == 1:
            refusal = self._probe_chat(bases[0])
            if not refusal:
                return bases[0], "the only model in /v1/models"
            raise BackendError(f"{self.server_label} lists only {bases[0]!r} and {refusal}")
        if names:
            shown = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
            raise BackendError(
                f"model.served_model {requested!r} is not served by {self.server_label}; it "
                f"serves {shown}: set model.served_model to one of them ({first_refusal})"
            )
        raise BackendError(f"{self.server_label}: {first_refusal}")

    def _probe_chat(self, model: str) -> str:
        """'' when a one-token greedy request for `model` is answered, else why not (one line)."""
        probe = SamplingParams(temperature=0.0, top_k=0, max_new_tokens=1)
        try:
            gen, status = self._complete(
                0,
                [{"role": "user", "content": "hi"}],
                probe,
                threading.Event(),
                model=model,
                retries=min(self.max_retries, 1),
            )
        except Unreachable as exc:
            raise self._unreachable(str(exc)) from None
        if gen.finish_reason != "error":
            return ""
        error = gen.error.removeprefix("the server refused the request: ")
        hint = SETUP_STATUSES.get(status, "").replace("${env}", "$" + self.api_key_env)
        return f"refused a one-token chat request for model {model!r}: {error}" + (
            f" ({hint})" if hint else ""
        )

    def _use_model(self, name: str, how: str) -> None:
        if self.active_model == self.base_model:
            self.active_model = name
        configured = self.base_model
        self.base_model = name
        if name == configured:
            self.model_note = f"model {name!r} ({how})"
            log.info("%s serves %s", self.server_label, self.model_note)
        else:
            self.model_note = f"model {name!r} ({how}; configured: {configured!r})"
            log.warning("%s: using %s", self.server_label, self.model_note)

    def check_sampling(self, params: SamplingParams) -> None:
        """At temperature > 0 repeated samples of a probe prompt must differ; stop if they never do.

        A server that copies the temperature but decodes greedily returns k copies: mean@k would
        read as pass@k and RSFT's samples per prompt would be one sample. When the configured
        temperature is low enough that copies are plausible, a second look at temperature 1 tells a
        confident model from a server that does not sample.
        """
        if params.temperature <= 0:
            return
        with self._check_lock:
            copies = self._probe_copies(params)
            if copies is not None and params.temperature < 1.0:
                if self._probe_copies(replace(params, temperature=1.0)) is None:
                    log.info(
                        "%s: samples at temperature %g repeat, at 1.0 they differ: the server "
                        "samples",
                        self.server_label,
                        params.temperature,
                    )
                    copies = None
            if copies is not None:
                raise BackendError(
                    f"sampling check failed: {self.server_label} returned the same text for all "
                    f"{PROBE_SAMPLES} samples of each probe prompt at temperature "
                    f"{params.temperature:g} (model {self.active_model!r}, reply {copies!r}); it "
                    "does not sample, and scores or RSFT groups would be copies"
                )
            self._sampling_ok.add(sampling_key(params))

    def _probe_copies(self, params: SamplingParams) -> str | None:
        """The repeated reply when every probe prompt got one text for all its samples, else None."""
        probe = replace(params, max_new_tokens=PROBE_TOKENS, stop=(), logprobs=False)
        prompts = [
            [{"role": "user", "content": p}] for p in PROBE_PROMPTS for _ in range(PROBE_SAMPLES)
        ]
        gens = self._generate(prompts, probe)
        failed = next((g for g in gens if g.finish_reason == "error"), None)
        if failed is not None:
            raise BackendError(f"sampling check: {self.server_label}: {short(failed.error, 200)}")
        groups = [gens[i : i + PROBE_SAMPLES] for i in range(0, len(gens), PROBE_SAMPLES)]
        if any(len({g.text for g in group}) > 1 for group in groups):
            return None
        return short(groups[0][0].text, 40)

    # ----------------------------------------------------------------- adapters
