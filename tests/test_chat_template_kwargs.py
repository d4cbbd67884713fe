"""`sampling.chat_template_kwargs` (e.g. `enable_thinking = false`) reaches every render: the hf
backend's, the trainer's SFT prefixes (so trained tokens are the served ones), and the request an
OpenAI-compatible server renders itself."""

from __future__ import annotations

import copy
import json

from servers import FaultServer, echo_responder

from whale_lab.backends.base import SamplingParams
from whale_lab.backends.hf import HFBackend
from whale_lab.backends.openai import OpenAIBackend
from whale_lab.models import load_model_and_tokenizer
from whale_lab.weights.sft import render_prefix

# The part of Qwen3's template that matters: an empty think block when thinking is off.
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
OFF = {"enable_thinking": False}


def test_the_hf_backend_and_the_trainer_render_with_the_template_variables() -> None:
    model, tok = load_model_and_tokenizer("micro")
    tok = copy.deepcopy(tok)
    tok.chat_template = TEMPLATE
    plain = HFBackend(model, tok)
    off = HFBackend(model, tok, chat_template_kwargs=OFF)
    assert "<think></think>" not in tok.decode(plain.encode_chat(CHAT))
    assert tok.decode(off.encode_chat(CHAT)).endswith("<think></think>")
    assert render_prefix(tok, CHAT, OFF) == off.encode_chat(CHAT)  # trained prefix = served one
    assert render_prefix(tok, CHAT) == plain.encode_chat(CHAT)


def test_an_openai_compatible_server_gets_them_in_every_request() -> None:
    with FaultServer() as server:
        server.set_default(echo_responder)
        be = OpenAIBackend(server.base_url, "m", chat_template_kwargs=OFF)
        try:
            be.generate([CHAT, CHAT], SamplingParams(max_new_tokens=4))
        finally:
            be.close()
        bodies = [json.loads(r.body) for r in server.requests_to("/chat/completions")]
        assert len(bodies) == 2 and all(b["chat_template_kwargs"] == OFF for b in bodies)
        be = OpenAIBackend(server.base_url, "m")
        try:
            be.generate([CHAT], SamplingParams(max_new_tokens=4))
        finally:
            be.close()
        last = json.loads(server.requests_to("/chat/completions")[-1].body)
        assert "chat_template_kwargs" not in last
