"""What the OpenAI-compatible backend and its server checks share: setup hints and small helpers."""

from __future__ import annotations

import logging

import httpx

from whale_lab.backends.base import SamplingParams

log = logging.getLogger("whale_lab.backends.openai")


class Unreachable(Exception):
    """The server could not be reached at all (connection refused, DNS, connect timeout)."""


# Full-weight publishes to a `vllm serve`: the worker method `POST /collective_rpc` names.
WEIGHT_LOADER_METHOD = "whale_load_weights"
WEIGHT_LOADER_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 and --worker-extension-cls "
    "whale_lab.backends.vllm_worker.WeightLoader (whale-lab installed where the server runs)"
)

SETUP_STATUSES = {
    401: "the server wants an API key: put it in ${env} (model.api_key_env)",
    403: "the API key in ${env} (model.api_key_env) may not use this model",
    404: "check model.base_url (it usually ends in /v1) and model.served_model "
    "(the name the server serves)",
}


def short(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 3] + "..."


def unreachable_reason(exc: Exception) -> str:
    text = str(exc).lower()
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect timeout"
    if "refused" in text or "errno 111" in text or "errno 61" in text:
        return "connection refused"
    if "name or service" in text or "nodename" in text or "getaddrinfo" in text:
        return "host name not found"
    return str(exc) or type(exc).__name__


def sampling_key(params: SamplingParams) -> tuple[float, float, int]:
    return (params.temperature, params.top_p, params.top_k)
