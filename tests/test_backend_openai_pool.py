"""`model.base_url` as a list: independent endpoints behind one backend, on two local servers.

Requests go to the endpoint with the fewest outstanding (a slow endpoint gets fewer), each prompt
keeps the seed it has on one endpoint, every publish reaches every endpoint and is verified on
each one, and an endpoint left on stale weights stops the run naming its URL.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from adapter_server import AdapterServer
from rsft_support import ParityDomain, tiny_config, write_harness
from servers import FaultServer, Reply, echo_responder

from whale_lab.backends import make_backend
from whale_lab.backends.base import BackendError, SamplingParams
from whale_lab.backends.openai import OpenAIBackend
from whale_lab.backends.openai_pool import EndpointPool
from whale_lab.context import RunContext
from whale_lab.store import RunStore
from whale_lab.weights.rsft import RsftPhase
from whale_lab.weights.sync import VERIFIED, WeightSyncError

PROMPTS = [[{"role": "user", "content": f"prompt {i}"}] for i in range(24)]


def _client(server: FaultServer, concurrency: int = 2) -> OpenAIBackend:
    return OpenAIBackend(server.base_url, "m", concurrency=concurrency, max_retries=0)


def test_requests_spread_by_least_outstanding_and_keep_their_seeds() -> None:
    with FaultServer() as fast, FaultServer() as slow:
        fast.set_default(echo_responder)
        slow.set_default(Reply.delayed(0.25, Reply.ok("slow")))
        pool = EndpointPool([_client(fast), _client(slow)])
        try:
            gens = pool.generate(PROMPTS, SamplingParams(max_new_tokens=4, seed=100))
        finally:
            pool.close()
        assert len(gens) == len(PROMPTS) and all(g.finish_reason == "stop" for g in gens)
        n_fast = len(fast.requests_to("/chat/completions"))
        n_slow = len(slow.requests_to("/chat/completions"))
        assert n_fast + n_slow == len(PROMPTS) and pool.sent == [n_fast, n_slow]
        assert n_slow >= 1 and n_fast > 2 * n_slow, (n_fast, n_slow)
        seeds = sorted(
            json.loads(r.body)["seed"]
            for s in (fast, slow)
            for r in s.requests_to("/chat/completions")
        )
        assert seeds == list(range(100, 100 + len(PROMPTS)))  # seed + i, as on one endpoint
        assert pool.outstanding == [0, 0]


def test_a_list_in_the_config_makes_a_pool_and_bad_lists_are_one_line() -> None:
    cfg = tiny_config(model={"backend": "openai", "base_url": ["http://a:1/v1", "http://b:2/v1"]})
    pool = make_backend(cfg)
    try:
        assert isinstance(pool, EndpointPool) and len(pool.endpoints) == 2
        assert pool.server_label == "2 endpoints (http://a:1/v1, http://b:2/v1)"
    finally:
        pool.close()
    one = make_backend(tiny_config(model={"backend": "openai", "base_url": ["http://a:1/v1"]}))
    assert isinstance(one, OpenAIBackend) and one.base_url == "http://a:1/v1"
    one.close()
    for urls, words in (([], "empty"), (["http://a:1/v1", "http://a:1/v1"], "more than once")):
        with pytest.raises(BackendError, match=words):
            make_backend(tiny_config(model={"backend": "openai", "base_url": urls}))


@pytest.fixture
def two_servers(tiny_model_dir: Path) -> Iterator[tuple[AdapterServer, AdapterServer]]:
    a = AdapterServer(tiny_model_dir, served_name="tiny").start()
    b = AdapterServer(tiny_model_dir, served_name="tiny").start()
    yield a, b
    a.stop()
    b.stop()


def _phase(tmp_path: Path, tiny_model_dir: Path, servers: tuple[AdapterServer, ...]) -> RsftPhase:
    cfg = tiny_config(
        model={
            "backend": "openai",
            "path": str(tiny_model_dir),
            "base_url": [s.base_url for s in servers],
            "served_model": "tiny",
        }
    )
    backend = make_backend(cfg)
    assert isinstance(backend, EndpointPool)
    return RsftPhase(RunContext.of(cfg, backend, ParityDomain(), RunStore(tmp_path / "run")))


def test_every_publish_reaches_and_is_verified_on_every_endpoint(
    tmp_path: Path, tiny_model_dir: Path, two_servers: tuple[AdapterServer, AdapterServer]
) -> None:
    phase = _phase(tmp_path, tiny_model_dir, two_servers)
    try:
        harness = write_harness(tmp_path)
        steps = [s for _ in range(2) for s in phase.run(harness, epochs=0.25).history]
        published = [s for s in steps if s.sync != "skipped"]
        assert published and {s.sync for s in published} == {VERIFIED}
        for server in two_servers:
            assert [name for name, _ in server.record.loads] == [
                s.served_version for s in published
            ]
            assert server.record.chat_models.count(published[-1].served_version) >= 3  # probes
            assert server.record.unloads == [s.served_version for s in published[:-1]]
        rollouts = [m for s in two_servers for m in s.record.chat_models]
        assert all(len(s.record.chat_models) > 4 for s in two_servers), "both served rollouts"
        assert len(rollouts) >= sum(s.rollouts for s in steps)
    finally:
        phase.backend.close()


def test_an_endpoint_left_on_stale_weights_stops_the_run_naming_it(
    tmp_path: Path, tiny_model_dir: Path, two_servers: tuple[AdapterServer, AdapterServer]
) -> None:
    good, stale = two_servers

    def ignore(name: str, path: str) -> tuple[int, dict]:  # says yes, keeps the old weights
        stale.adapters[name] = stale.adapters.get("last", "")
        stale.record.loads.append((name, path))
        return 200, {"message": "ok"}

    stale.load = ignore  # type: ignore[method-assign]
    stale.adapters["last"] = ""
    real_complete = stale.complete

    def complete(body: dict) -> tuple[int, dict]:  # a name it "loaded" serves the base model
        if body.get("model") in stale.adapters:
            body = {**body, "model": "tiny"}
        return real_complete(body)

    stale.complete = complete  # type: ignore[method-assign]
    phase = _phase(tmp_path, tiny_model_dir, (good, stale))
    try:
        with pytest.raises(WeightSyncError) as info:
            for _ in range(4):
                phase.run(write_harness(tmp_path), epochs=0.25)
        assert stale.base_url in str(info.value) and good.base_url not in str(info.value)
    finally:
        phase.backend.close()
