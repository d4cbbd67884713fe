"""A vLLM worker extension that loads full weights from a file, for a `vllm serve` run.

Start the server with it and with vLLM's development endpoints, so the openai backend can publish
full fine-tuned weights through `POST /collective_rpc` (then `POST /reset_prefix_cache`):

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL \\
        --worker-extension-cls whale_lab.backends.vllm_worker.WeightLoader

vLLM mixes this class into each of its GPU workers; whale-lab must be importable where the
server runs, and the weights file (written world-readable) must be readable there.
"""

from __future__ import annotations

from whale_lab.backends.openai_common import WEIGHT_LOADER_METHOD
from whale_lab.backends.vllm import load_weights_in_worker


class WeightLoader:
    """The method `collective_rpc` names; `self` is the vLLM worker it is mixed into."""

    def whale_load_weights(self, path: str) -> int:
        return load_weights_in_worker(self, path)


assert hasattr(WeightLoader, WEIGHT_LOADER_METHOD)
