"""The OpenAI-compatible backend: against a real `transformers serve`, and against scripted faults."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import FaultServer, Reply, Request, TransformersServer, echo_responder, refused_url

from whale_lab.backends import BackendError, HFBackend, OpenAIBackend, SamplingParams, make_backend
from whale_lab.config import Config, ModelConfig

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Solve the problem."}, {"role": "user", "content": "2 + 3 = ?"}],
    [{"role": "user", "content": "the answer is board legal moves FEN e2e4"}],
    [{"role": "user", "content": "x"}],
]


def fast(base_url: str, model: str = "test-model", **kw: object) -> OpenAIBackend:
    """A backend with short backoffs, so retry tests take milliseconds, not seconds."""
    opts: dict = {"timeout_s": 5.0, "max_retries": 2, "concurrency": 4, "backoff_s": 0.01}
    opts.update(kw)
    return OpenAIBackend(base_url, model, **opts)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


# ------------------------------------------------------------ fault server


@pytest.fixture
def fault() -> Iterator[FaultServer]:
    with FaultServer() as server:
        yield server


def test_request_body_and_order(fault: FaultServer) -> None:
    backend = fast(fault.base_url, concurrency=3)
    params = SamplingParams(
        temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=17, stop=("</answer>",), seed=5
    )
    prompts = [user(f"q{i}") for i in range(7)]
    gens = backend.generate(prompts, params)
    backend.close()
    assert [g.text for g in gens] == [f"echo: q{i}" for i in range(7)]
    assert all(g.finish_reason == "stop" and g.prompt_tokens == 7 for g in gens)
    bodies = {
        r.json["messages"][-1]["content"]: r.json for r in fault.requests_to("/chat/completions")
    }
    assert bodies["q3"] == {
        "model": "test-model", "messages": user("q3"), "temperature": 0.7, "top_p": 0.9,
        "max_tokens": 17, "n": 1, "stop": ["</answer>"], "top_k": 20, "seed": 8,
    }  # fmt: skip
    assert fault.requests[0].path == "/v1/chat/completions"


def test_server_down_fails_fast_with_advice() -> None:
    backend = fast(refused_url(), max_retries=2)
    with pytest.raises(BackendError, match=r"cannot reach .*connection refused.*is it running"):
        backend.generate([user("a"), user("b")], GREEDY)
    backend.close()


def test_timeouts_are_retried_then_reported(fault: FaultServer) -> None:
    fault.set_default(Reply.delayed(3.0))
    backend = fast(fault.base_url, timeout_s=0.3, max_retries=1)
    gen = backend.generate([user("slow")], GREEDY)[0]
    backend.close()
    assert gen.finish_reason == "error"
    assert "no answer within 0.3 s" in gen.error and "after 2 attempts" in gen.error
    assert len(fault.requests_to("/chat/completions")) == 2


def test_server_errors_are_retried_until_success(fault: FaultServer) -> None:
    fault.script("/chat/completions", Reply.error(500), Reply.error(503), Reply.dropped())
    backend = fast(fault.base_url, max_retries=3)
    gen = backend.generate([user("hello")], GREEDY)[0]
    backend.close()
    assert (gen.text, gen.finish_reason) == ("echo: hello", "stop")
    assert len(fault.requests_to("/chat/completions")) == 4


def test_bad_answers_fail_only_their_prompt(fault: FaultServer) -> None:
    def responder(req: Request) -> Reply:
        last = req.json["messages"][-1]["content"]
        return {"bad": Reply.malformed(), "empty": Reply.empty_choices()}.get(
            last, echo_responder(req)
        )

    fault.set_default(responder)
    backend = fast(fault.base_url, max_retries=1)
    gens = backend.generate([user("a"), user("bad"), user("empty"), user("b")], GREEDY)
    backend.close()
    assert [g.finish_reason for g in gens] == ["stop", "error", "error", "stop"]
    assert [g.text for g in gens] == ["echo: a", "", "", "echo: b"]
    assert "malformed JSON" in gens[1].error and "no choices" in gens[2].error
    sent = [r.json["messages"][-1]["content"] for r in fault.requests_to("/chat/completions")]
    assert sent.count("bad") == sent.count("empty") == 2 and sent.count("a") == 1


def test_client_errors_are_not_retried(fault: FaultServer) -> None:
    fault.script("/chat/completions", Reply.error(400, "prompt too long"))
    backend = fast(fault.base_url, max_retries=3, concurrency=1)
    gens = backend.generate([user("long"), user("ok")], GREEDY)
    backend.close()
    assert gens[0].finish_reason == "error" and "HTTP 400: prompt too long" in gens[0].error
    assert gens[1].text == "echo: ok"
    assert len(fault.requests_to("/chat/completions")) == 2


def test_every_prompt_unauthorized_is_a_setup_error(
    fault: FaultServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    fault.set_default(Reply.error(401, "invalid api key"))
    monkeypatch.setenv("WHALE_TEST_KEY", "sk-test")
    backend = fast(fault.base_url, api_key_env="WHALE_TEST_KEY")
    with pytest.raises(BackendError, match=r"invalid api key.*\$WHALE_TEST_KEY"):
        backend.generate([user("a"), user("b")], GREEDY)
    backend.close()
    assert fault.requests[0].headers["Authorization"] == "Bearer sk-test"
    assert len(fault.requests) == 2  # not retried


def test_missing_usage_falls_back_to_an_estimate(fault: FaultServer, tiny_model_dir: Path) -> None:
    fault.set_default(
        Reply.ok("x" * 40, prompt_tokens=None, completion_tokens=None, finish_reason="length")
    )
    backend = fast(fault.base_url)
    g = backend.generate([user("a" * 80)], GREEDY)[0]
    assert (g.completion_tokens, g.finish_reason) == (10, "length")
    assert g.prompt_tokens == backend.count_tokens(user("a" * 80)) > 20
    backend.close()
    from whale_lab.models import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(str(tiny_model_dir))
    with_tok = fast(fault.base_url, tokenizer=tok)
    g = with_tok.generate([user("a")], GREEDY)[0]
    assert g.prompt_tokens == HFBackend(None, tok).count_tokens(user("a"))
    with_tok.close()


def test_adapter_load_switches_the_served_model(fault: FaultServer) -> None:
    backend = fast(fault.base_url, "base-model")
    backend.load_adapter("/ckpt/rsft-1", "rsft-1")
    assert fault.requests[-1].path == "/v1/load_lora_adapter"
    assert fault.requests[-1].json == {"lora_name": "rsft-1", "lora_path": "/ckpt/rsft-1"}
    backend.generate([user("a"), user("b")], GREEDY)
    assert {r.json["model"] for r in fault.requests_to("/chat/completions")} == {"rsft-1"}
    # Loading the same name again replaces the weights: unload first, then load.
    backend.load_adapter("/ckpt/rsft-2", "rsft-1")
    assert [r.path for r in fault.requests[-2:]] == [
        "/v1/unload_lora_adapter",
        "/v1/load_lora_adapter",
    ]
    backend.unload_adapter("rsft-1")
    backend.generate([user("c")], GREEDY)
    assert fault.requests_to("/chat/completions")[-1].json["model"] == "base-model"
    backend.close()


def test_adapter_already_loaded_elsewhere_is_replaced(fault: FaultServer) -> None:
    fault.script(
        "/load_lora_adapter", Reply.error(400, "The lora adapter 'a' has already been loaded.")
    )
    backend = fast(fault.base_url)
    backend.load_adapter("/ckpt/a", "a")
    assert [r.path for r in fault.requests] == [
        "/v1/load_lora_adapter",
        "/v1/unload_lora_adapter",
        "/v1/load_lora_adapter",
    ]
    assert backend.active_model == "a"
    backend.close()


def test_adapter_endpoint_missing_is_a_clear_error(fault: FaultServer) -> None:
    fault.script("/load_lora_adapter", Reply(404, {"detail": "Not Found"}))
    backend = fast(fault.base_url, "base-model")
    with pytest.raises(BackendError, match="does not support runtime LoRA.*--enable-lora"):
        backend.load_adapter("/ckpt/a", "a")
    backend.generate([user("x")], GREEDY)
    assert fault.requests_to("/chat/completions")[-1].json["model"] == "base-model"
    backend.close()


def test_make_backend_builds_openai_from_config(tiny_model_dir: Path) -> None:
    cfg = Config(
        model=ModelConfig(
            backend="openai",
            path=str(tiny_model_dir),
            base_url="http://127.0.0.1:9/v1/",
            served_model="served",
            max_retries=5,
            concurrency=2,
            request_timeout_s=7.0,
        )
    )
    backend = make_backend(cfg)
    assert isinstance(backend, OpenAIBackend)
    assert (
        backend.base_url,
        backend.active_model,
        backend.max_retries,
        backend.concurrency,
        backend.timeout_s,
    ) == ("http://127.0.0.1:9/v1", "served", 5, 2, 7.0)
    assert backend.server_root == "http://127.0.0.1:9"
    assert backend.tokenizer is not None  # a local folder lends its tokenizer for counting
    backend.close()
    with pytest.raises(BackendError, match="model.base_url must start with http"):
        OpenAIBackend("localhost:8000/v1", "m")


# ------------------------------------------------------------ real server
# Last in the file: the session's server, launched at collection, starts while the tests above run.


def test_batch_against_transformers_serve(
    transformers_server: TransformersServer, tiny_model_dir: Path
) -> None:
    from whale_lab.models import load_model_and_tokenizer

    backend = fast(transformers_server.base_url, transformers_server.model, concurrency=3)
    params = SamplingParams(temperature=0.0, top_k=20, max_new_tokens=6, seed=1)
    try:
        gens = backend.generate(PROMPTS, params)
    finally:
        backend.close()
    # `transformers serve` refuses top_k (HTTP 422): the backend drops it and carries on.
    assert backend.dropped_fields == {"top_k"}
    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    hf = HFBackend(model, tok)
    expected = hf.generate(PROMPTS, params)
    for g, e, p in zip(gens, expected, PROMPTS, strict=True):
        assert g.finish_reason == "length" and g.completion_tokens == 6
        assert g.prompt_tokens == hf.count_tokens(p)  # from the server's usage block
        assert g.text == e.text


def test_same_text_as_the_hf_backend_on_the_same_weights(
    transformers_server: TransformersServer, lively_model_dir: Path
) -> None:
    from whale_lab.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(lively_model_dir))
    hf = HFBackend(model, tok)
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    expected = hf.generate(PROMPTS, params)
    assert len({e.text for e in expected}) == len(PROMPTS)
    backend = fast(transformers_server.base_url, str(lively_model_dir), tokenizer=tok)
    try:
        gens = backend.generate(PROMPTS, params)
        assert [(g.text, g.finish_reason, g.prompt_tokens, g.completion_tokens) for g in gens] == [
            (e.text, e.finish_reason, e.prompt_tokens, e.completion_tokens) for e in expected
        ]
        # A stop string cuts the text where the in-process backend cuts it.
        text = expected[2].text
        stop = next(
            text[i : i + 2]
            for i in range(2, len(text) - 2)
            if text[i : i + 2].isascii() and text[i : i + 2].isalnum()
        )
        stopped = SamplingParams(temperature=0.0, max_new_tokens=10, stop=(stop,))
        got = backend.generate(PROMPTS[2:3], stopped)[0]
        want = hf.generate(PROMPTS[2:3], stopped)[0]
        assert (
            (got.text, got.finish_reason)
            == (want.text, "stop")
            == (text[: text.index(stop)], "stop")
        )
    finally:
        backend.close()


def test_transformers_serve_has_no_adapter_endpoint(
    transformers_server: TransformersServer,
) -> None:
    backend = fast(transformers_server.base_url, transformers_server.model)
    with pytest.raises(BackendError, match="--enable-lora.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
        backend.load_adapter("/tmp/adapter", "rsft-1")
    assert backend.active_model == transformers_server.model
    backend.close()
