"""The openai backend's honesty checks against real servers on 127.0.0.1.

`transformers serve` with the micro model (it samples only when told do_sample, and the check
tells); a stdlib server that answers every request with the same text (the sampling check stops);
a server that refuses everything with HTTP 400 (`whale-lab eval` exits with one line, no mean@k);
model names resolved from `/v1/models`; logprobs as vLLM returns them; the project's adapter
server passing `preflight(adapters=True)`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from servers import FaultServer, Reply, Request, TransformersServer, chat_completion

from whale_lab.backends import BackendError, HFBackend, OpenAIBackend, SamplingParams, make_backend
from whale_lab.config import config_from_dict

REPO = Path(__file__).resolve().parent.parent
HOT = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=12, seed=7)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def openai_config(base_url: str, tmp_path: Path | None = None, **model: Any) -> Any:
    run = {"directory": str(tmp_path / "runs")} if tmp_path else {}
    return config_from_dict(
        {
            "run": run,
            "model": {"backend": "openai", "base_url": base_url, "max_retries": 1, **model},
        }
    )


# ------------------------------------------------------- stdlib servers


class FixedServer:
    """Answers every request, whatever its path or method, with one fixed status and body."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                outer.requests.append((self.command, self.path))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _answer
            do_POST = _answer

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def __enter__(self) -> FixedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def test_identical_text_server_stops_the_sampling_check() -> None:
    with FixedServer(200, chat_completion("always the same")) as server:
        backend = make_backend(openai_config(server.base_url, served_model="m"))
        try:
            # Greedy needs no check: copies are what was asked.
            assert backend.generate([user("a")], SamplingParams(temperature=0.0)) != []
            with pytest.raises(BackendError) as err:
                backend.generate([user("a"), user("b")], HOT)
        finally:
            backend.close()
    message = str(err.value)
    assert "\n" not in message
    assert "sampling check failed" in message and server.base_url in message
    assert "'always the same'" in message and "temperature 1" in message


def test_identical_text_at_a_low_temperature_gets_a_second_look() -> None:
    """At temperature 0.2 copies may be a confident model: the check looks again at 1.0."""
    with FixedServer(200, chat_completion("same")) as server:
        backend = make_backend(openai_config(server.base_url, served_model="m"))
        with pytest.raises(BackendError, match="does not sample"):
            backend.generate([user("a")], SamplingParams(temperature=0.2))
        backend.close()
    chats = [p for m, p in server.requests if m == "POST"]
    assert len(chats) == 1 + 2 * 8  # the one-token probe, then 8 samples at 0.2 and 8 at 1.0


def test_refusing_server_fails_eval_with_one_line(tmp_path: Path) -> None:
    refusal = {"error": {"message": "model 'micro' is not known here", "code": 400}}
    with FixedServer(400, refusal) as server:
        proc = subprocess.run(
            [
                sys.executable, "-m", "whale_lab", "eval",
                "--set", "model.backend=openai",
                "--set", f"model.base_url={server.base_url}",
                "--set", f"run.directory={tmp_path / 'runs'}",
                "--limit", "2", "--k", "2",
            ],
            capture_output=True, text=True, timeout=120, cwd=REPO,
        )  # fmt: skip
    assert proc.returncode != 0
    assert "mean@" not in proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("whale-lab: error:") and "HTTP 400" in lines[0]
    assert server.base_url in lines[0] and "is not known here" in lines[0]


def test_refusing_server_direct_construction_stops_scoring_after_the_wave(tmp_path: Path) -> None:
    """Without preflight (a backend built by hand) the scoring wave itself stops the command."""
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import default_harness_path, score_harness

    cfg = config_from_dict({"domain": {"splits": {"val": 3}}})
    domain = make_domain(cfg)
    with FaultServer() as fault:
        fault.set_default(Reply.error(400, "no such model"))
        backend = OpenAIBackend(fault.base_url, "m", max_retries=0, backoff_s=0.01)
        with pytest.raises(BackendError) as err:
            score_harness(domain, default_harness_path(cfg), domain.tasks("val"), 2, backend, HOT)
        backend.close()
    domain.close()
    message = str(err.value)
    assert "\n" not in message and "scoring stopped: 6 of 6 episodes" in message
    assert f"at {fault.base_url} answered HTTP 400: no such model" in message


def test_a_few_invalid_episodes_are_shown_not_scored(tmp_path: Path) -> None:
    from whale_lab.domains import make_domain
    from whale_lab.evaluate import default_harness_path, score_harness

    cfg = config_from_dict({"domain": {"splits": {"val": 4}}})
    domain = make_domain(cfg)
    with FaultServer() as fault:
        fault.script("/chat/completions", Reply.error(400, "one bad request"))
        backend = OpenAIBackend(fault.base_url, "m", max_retries=0, concurrency=1)
        rep = score_harness(domain, default_harness_path(cfg), domain.tasks("val"), 5, backend, HOT)
        backend.close()
        # The same wave with no tolerance at all stops.
        fault.script("/chat/completions", Reply.error(400, "one bad request"))
        backend = OpenAIBackend(fault.base_url, "m", max_retries=0, concurrency=1)
        with pytest.raises(BackendError, match="1 of 20 episodes"):
            score_harness(
                domain, default_harness_path(cfg), domain.tasks("val"), 5, backend, HOT,
                max_invalid_share=0.0,
            )  # fmt: skip
        backend.close()
    domain.close()
    assert rep.rollouts == 20  # 1 of 20 is 5%: not more than the default share
    assert rep.diagnostics["invalid_episodes"] == 1.0
    assert rep.diagnostics["invalid_share"] == pytest.approx(0.05)


# ------------------------------------------------ /v1/models and vLLM fields


def _vllm_like(served: str) -> Any:
    """A responder that lists `served` as vLLM does and refuses chat for any other name."""

    def respond(req: Request) -> Reply:
        if req.path.endswith("/models"):
            return Reply(200, {"object": "list", "data": [{"id": served, "owned_by": "vllm"}]})
        body = req.json or {}
        if body.get("model") != served:
            return Reply(
                404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
            )
        content = [{"token": f"token_id:{i}", "logprob": -0.5 * i} for i in (11, 12, 13)]
        reply = chat_completion("abc", model=served)
        if body.get("logprobs"):
            reply["choices"][0]["logprobs"] = {"content": content}
        return Reply(200, reply)

    return respond


def test_model_name_resolved_from_v1_models_and_vllm_fields_sent() -> None:
    with FaultServer() as fault:
        fault.set_default(_vllm_like("Qwen/served"))
        backend = make_backend(openai_config(fault.base_url, served_model="wrong-name"))
        gens = backend.generate([user("a")], SamplingParams(temperature=0.0, logprobs=True, seed=1))
        assert isinstance(backend, OpenAIBackend)
        assert (backend.server_kind, backend.base_model, backend.active_model) == (
            "vllm", "Qwen/served", "Qwen/served",
        )  # fmt: skip
        assert "'Qwen/served' (the only model in /v1/models" in backend.model_note
        assert "configured: 'wrong-name'" in backend.model_note
        last = fault.requests_to("/chat/completions")[-1].json
        assert last["model"] == "Qwen/served" and last["top_k"] == 20 and last["seed"] == 1
        assert last["logprobs"] is True and last["return_tokens_as_token_ids"] is True
        assert gens[0].token_ids == (11, 12, 13)
        assert gens[0].token_logprobs == (-5.5, -6.0, -6.5)
        # Without logprobs asked for, none are requested and none are filled in.
        plain = backend.generate([user("b")], SamplingParams(temperature=0.0))[0]
        assert "logprobs" not in fault.requests_to("/chat/completions")[-1].json
        assert (plain.token_ids, plain.token_logprobs) == ((), ())
        backend.close()


def test_unknown_model_among_several_is_a_one_line_error() -> None:
    listing = {"object": "list", "data": [{"id": "a"}, {"id": "b"}]}
    with FaultServer() as fault:
        fault.script("/models", Reply(200, listing))
        fault.set_default(Reply.error(404, "The model `c` does not exist."))
        backend = make_backend(openai_config(fault.base_url, served_model="c"))
        with pytest.raises(BackendError) as err:
            backend.generate([user("x")], HOT)
        backend.close()
    message = str(err.value)
    assert "\n" not in message
    assert "model.served_model 'c' is not served by" in message and "serves 'a', 'b'" in message


def test_logprobs_in_another_shape_are_left_empty() -> None:
    """Tokens as text, not "token_id:N": nothing to compare, so nothing is filled in."""
    reply = chat_completion("hi")
    reply["choices"][0]["logprobs"] = {"content": [{"token": "hi", "logprob": -0.1}]}
    with FaultServer() as fault:
        fault.set_default(Reply(200, reply))
        backend = OpenAIBackend(fault.base_url, "m")
        gen = backend.generate([user("x")], SamplingParams(temperature=0.0, logprobs=True))[0]
        backend.close()
    assert (gen.text, gen.token_ids, gen.token_logprobs) == ("hi", (), ())


def test_preflight_adapters_on_a_server_without_the_endpoint() -> None:
    with FaultServer() as fault:
        fault.script("/load_lora_adapter", Reply(404, {"detail": "Not Found"}))
        backend = OpenAIBackend(fault.base_url, "m")
        with pytest.raises(BackendError, match="does not support runtime LoRA.*--enable-lora"):
            backend.preflight(adapters=True)
        backend.preflight()  # the chat side alone is fine
        assert backend.preflighted
        backend.close()


def test_preflight_against_the_project_adapter_server(tiny_model_dir: Path) -> None:
    from adapter_server import AdapterServer

    server = AdapterServer(tiny_model_dir, served_name="tiny").start()
    try:
        backend = make_backend(
            openai_config(server.base_url, path=str(tiny_model_dir), served_model="tiny")
        )
        assert isinstance(backend, OpenAIBackend)
        backend.preflight(adapters=True)
        assert backend.base_model == "tiny" and server.record.loads == []
        # The tiny random model at temperature 1 draws different replies.
        backend.check_sampling(HOT)
        backend.close()
    finally:
        server.stop()


# --------------------------------------------------- transformers serve


@pytest.fixture(scope="module")
def micro_server() -> Iterator[TransformersServer]:
    """`transformers serve` pinned to the micro model; skipped where it cannot start."""
    from whale_lab.presets import resolve_model_path

    server = TransformersServer(resolve_model_path("micro"), pin=True, startup_timeout_s=90)
    try:
        server.start()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"`transformers serve` cannot start here: {str(exc).splitlines()[0]}")
    yield server
    server.stop()


def test_transformers_serve_samples_and_resolves_the_preset_name(
    micro_server: TransformersServer,
) -> None:
    backend = make_backend(openai_config(micro_server.base_url, path="micro"))
    assert isinstance(backend, OpenAIBackend)
    try:
        gens = backend.generate([user("What is 2 + 3?")] * 6, replace(HOT, logprobs=True))
        assert backend.server_kind == "transformers"
        assert backend.base_model == micro_server.model  # the folder the preset stands for
        assert "configured: 'micro'" in backend.model_note
        assert len({g.text for g in gens}) > 1, "k samples of one prompt were copies"
        # `transformers serve` returns no logprobs: left empty (the caller says 'unverified').
        assert all(g.token_logprobs == () for g in gens)
    finally:
        backend.close()


def test_a_minimum_reply_length_is_asked_for_and_dropped_where_refused() -> None:
    """vLLM's `min_tokens`, `transformers serve`'s `min_new_tokens`; a server that refuses the
    field has it dropped (the weight-sync probes then report why they were empty)."""
    held = SamplingParams(temperature=0.0, max_new_tokens=8, min_new_tokens=8, logprobs=True)
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m")
    assert backend._body(user("x"), held, 0)["min_tokens"] == 8
    assert "min_tokens" not in backend._body(user("x"), replace(held, min_new_tokens=0), 0)
    backend.close()
    hf_serve = OpenAIBackend("http://127.0.0.1:9/v1", "m", server_kind="transformers")
    body = hf_serve._body(user("x"), held, 0)
    assert "min_tokens" not in body
    assert json.loads(body["generation_config"]) == {
        "do_sample": False, "max_new_tokens": 8, "min_new_tokens": 8,
    }  # fmt: skip
    hf_serve.close()
    with FaultServer() as server:
        refusal = "extra fields not permitted: min_tokens"
        server.script("/chat/completions", Reply.error(422, refusal))
        server.set_default(Reply.ok("fine"))
        backend = OpenAIBackend(server.base_url, "m", max_retries=0)
        try:
            (gen,) = backend.generate([user("x")], held)
        finally:
            backend.close()
        assert gen.text == "fine" and backend.dropped_fields == {"min_tokens"}
        sent = [r.json for r in server.requests_to("/chat/completions")]
        assert [("min_tokens" in b) for b in sent] == [True, False]


def test_transformers_serve_body_turns_sampling_on() -> None:
    """`transformers serve` samples only when a generation_config says do_sample."""
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m", server_kind="transformers")
    body = backend._body(user("x"), replace(HOT, logprobs=True), 2)
    assert json.loads(body["generation_config"]) == {
        "do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 20, "max_new_tokens": 12,
    }  # fmt: skip
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (1.0, 12, 9)
    assert "top_k" not in body and "n" not in body and "logprobs" not in body
    greedy = backend._body(user("x"), SamplingParams(temperature=0.0, max_new_tokens=5), 0)
    assert json.loads(greedy["generation_config"]) == {"do_sample": False, "max_new_tokens": 5}
    backend.close()


def test_transformers_serve_without_do_sample_is_caught(micro_server: TransformersServer) -> None:
    """The plain OpenAI fields (temperature only) decode greedily there: the check says so."""
    backend = OpenAIBackend(micro_server.base_url, micro_server.model, backoff_s=0.01)
    assert backend.server_kind == ""  # not looked at: the plain fields
    with pytest.raises(BackendError, match=r"sampling check failed: .* does not sample"):
        backend.check_sampling(SamplingParams(temperature=1.0, top_k=0, seed=3))
    backend.close()


def test_transformers_serve_wrong_name_and_greedy_parity(
    micro_server: TransformersServer,
) -> None:
    from whale_lab.models import load_model_and_tokenizer

    cfg = openai_config(micro_server.base_url, path="org/not-here", served_model="not-served")
    backend = make_backend(cfg)
    assert isinstance(backend, OpenAIBackend)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    prompts = [user("What is 2 + 3?"), user("hi")]
    try:
        got = backend.generate(prompts, greedy)
        assert backend.base_model == micro_server.model
        # Neither name is listed and the pinned server refuses both: its one model is used.
        assert "the only model in /v1/models" in backend.model_note
        assert "configured: 'not-served'" in backend.model_note
        with pytest.raises(BackendError, match="does not support runtime LoRA"):
            backend.preflight(adapters=True)
    finally:
        backend.close()
    # The generation config sent for do_sample leaves greedy decoding as the hf backend does it.
    model, tok = load_model_and_tokenizer(micro_server.model)
    want = HFBackend(model, tok).generate(prompts, greedy)
    assert [g.text for g in got] == [w.text for w in want]
