"""Full fine-tuning against a vLLM server: the weights go through the development endpoint
`/collective_rpc` to the `WeightLoader` worker extension, the prefix cache is reset, and each
publish is verified by the served-policy check; a server without the endpoint is one line
before the first rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
from adapter_server import AdapterServer
from rsft_support import ParityDomain, tiny_config, write_harness

from whale_lab.backends import make_backend
from whale_lab.backends.base import BackendError
from whale_lab.backends.openai import OpenAIBackend
from whale_lab.backends.vllm_worker import WeightLoader
from whale_lab.context import RunContext
from whale_lab.store import RunStore
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sync import VERIFIED


def _cfg(server: AdapterServer, tiny_model_dir: Path) -> object:
    return tiny_config(
        model={"backend": "openai", "path": str(tiny_model_dir), "base_url": server.base_url,
               "served_model": "tiny"},
        rsft={"full_finetune": True},
    )  # fmt: skip


def test_full_weights_reach_the_server_and_are_verified(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    server = AdapterServer(tiny_model_dir, served_name="tiny", dev_mode=True).start()
    cfg = _cfg(server, tiny_model_dir)
    backend = make_backend(cfg)
    try:
        assert isinstance(backend, OpenAIBackend) and backend.full_weights
        backend.preflight(adapters=True)  # the weights endpoint, not the LoRA one
        phase = RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(tmp_path / "run")))
        assert phase.mode == "adapter" and not phase.tm.lora
        harness = write_harness(tmp_path)
        steps = [s for _ in range(2) for s in phase.run(harness, epochs=0.25).history]
        published = [s for s in steps if s.sync != "skipped"]
        assert published and {s.sync for s in published} == {VERIFIED}
        assert len(server.record.weight_loads) == len(published)
        assert server.record.cache_resets == len(published)
        assert server.record.loads == []  # no adapter in full fine-tuning
        import torch

        trained = dict(phase.tm.base.named_parameters())
        for name, p in server.base.named_parameters():
            assert torch.equal(p, trained[name]), name
    finally:
        backend.close()
        server.stop()


def test_a_server_without_the_development_endpoint_is_one_line(tiny_model_dir: Path) -> None:
    server = AdapterServer(tiny_model_dir, served_name="tiny").start()
    backend = make_backend(_cfg(server, tiny_model_dir))
    try:
        with pytest.raises(BackendError) as info:
            backend.preflight(adapters=True)
        msg = str(info.value)
        assert "does not support full-weight updates" in msg and "\n" not in msg
        assert "VLLM_SERVER_DEV_MODE=1" in msg and "WeightLoader" in msg
    finally:
        backend.close()
        server.stop()


def test_the_worker_extension_loads_through_the_model_loader(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    got: list = []
    model = type("M", (), {"load_weights": lambda self, weights: got.extend(weights)})()
    worker = WeightLoader()
    worker.device = "cpu"  # type: ignore[attr-defined]
    worker.model_runner = type("R", (), {"model": model})()  # type: ignore[attr-defined]
    save_file({"a.weight": torch.ones(2, 2)}, str(tmp_path / "w.safetensors"))
    assert worker.whale_load_weights(str(tmp_path / "w.safetensors")) == 1
    assert [n for n, _ in got] == ["a.weight"]
