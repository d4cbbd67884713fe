"""A small real OpenAI-compatible server with vLLM's runtime LoRA endpoints, for on-policy tests.

It loads a transformers model from a folder (its own copy, independent of any trainer), serves
`POST /v1/chat/completions` with it, and implements `POST /v1/load_lora_adapter` /
`/v1/unload_lora_adapter` the way vLLM does: the adapter folder is read from disk with peft and
requests that name the adapter as their `model` generate with it. Every request is recorded.
With `logprobs` (and `return_tokens_as_token_ids`) it returns each sampled token as vLLM does,
`token_id:N` with the model's raw log-probability, so the served-policy check can measure it.
With `dev_mode` it also has vLLM's development endpoints `/collective_rpc` (the `WeightLoader`
extension's `whale_load_weights`: full weights from a safetensors file into its model) and
`/reset_prefix_cache`; without it they answer 404, as vLLM does without VLLM_SERVER_DEV_MODE.

Run it standalone: `python tests/adapter_server.py MODEL_FOLDER [PORT]`.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_RNG = threading.Lock()  # the process's torch RNG, shared by every server in it


@dataclass
class Served:
    """What the server did, for assertions."""

    chat_models: list[str] = field(default_factory=list)  # `model` of each chat request
    loads: list[tuple[str, str]] = field(default_factory=list)  # (name, path)
    unloads: list[str] = field(default_factory=list)
    weight_loads: list[str] = field(default_factory=list)  # paths given to /collective_rpc
    cache_resets: int = 0


class AdapterServer:
    """`http.server` in a thread over one model; peft adapters loaded from disk on request."""

    def __init__(
        self,
        model_dir: str | Path,
        served_name: str = "base",
        port: int = 0,
        dev_mode: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model_dir = str(model_dir)
        self.served_name = served_name
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.base = AutoModelForCausalLM.from_pretrained(self.model_dir)
        self.base.eval()
        self.peft: Any = None  # a PeftModel once the first adapter arrives
        self.adapters: dict[str, str] = {}  # public name -> internal peft adapter name
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.record = Served()
        self.dev_mode = dev_mode
        self._port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ model side
    def load(self, name: str, path: str) -> tuple[int, dict]:
        folder = Path(path)
        if not (folder / "adapter_config.json").exists():
            return 400, {"error": {"message": f"no adapter_config.json in {path}"}}
        with self._lock:
            if name in self.adapters:
                return 400, {
                    "error": {"message": f"The lora adapter '{name}' has already been loaded."}
                }
            internal = f"a{next(self._ids)}"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated helpers
                if self.peft is None:
                    from peft import PeftModel

                    self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=internal)
                else:
                    self.peft.load_adapter(path, adapter_name=internal)
            self.peft.eval()
            self.adapters[name] = internal
            self.record.loads.append((name, path))
        return 200, {"message": f"Success: LoRA adapter '{name}' added successfully."}

    def unload(self, name: str) -> tuple[int, dict]:
        with self._lock:
            if name not in self.adapters:
                return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found."}}
            self.adapters.pop(name)
            self.record.unloads.append(name)
        return 200, {"message": f"Success: LoRA adapter '{name}' removed successfully."}

    def collective_rpc(self, body: dict) -> tuple[int, dict]:
        import torch
        from safetensors.torch import load_file

        method = body.get("method")
        if method is None:
            return 400, {"detail": "Missing 'method' in request body"}
        if method != "whale_load_weights":
            return 500, {"detail": f"worker has no method {method!r}"}
        (path,) = body.get("args") or [""]
        tensors = load_file(str(path))
        with self._lock, torch.no_grad():
            state = self.base.state_dict()
            for name, t in tensors.items():
                state[name].copy_(t)
            self.record.weight_loads.append(str(path))
        return 200, {"results": [len(tensors)]}

    def complete(self, body: dict) -> tuple[int, dict]:
        import torch

        model_name = str(body.get("model", ""))
        messages = body.get("messages")
        if not isinstance(messages, list):
            return 400, {"error": {"message": "messages must be a list"}}
        temperature = float(body.get("temperature", 1.0))
        max_tokens = int(body.get("max_tokens") or 16)
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "min_new_tokens": int(body.get("min_tokens") or 0) or None,  # vLLM's field
            "pad_token_id": self.tokenizer.pad_token_id,
            "eos_token_id": self.tokenizer.eos_token_id,
        }
        if temperature > 0:
            kwargs.update(
                do_sample=True,
                temperature=temperature,
                top_p=float(body.get("top_p", 1.0)),
                top_k=int(body.get("top_k", 0)),
            )
        else:
            kwargs.update(do_sample=False)
        want_lp = bool(body.get("logprobs"))
        if want_lp:
            kwargs.update(output_logits=True, return_dict_in_generate=True)
        with self._lock:
            self.record.chat_models.append(model_name)
            if model_name == self.served_name:
                model = self.base
                ctx: Any = self.peft.disable_adapter() if self.peft is not None else _null()
            elif model_name in self.adapters:
                self.peft.set_adapter(self.adapters[model_name])
                model, ctx = self.peft, _null()
            else:
                return 404, {"error": {"message": f"The model `{model_name}` does not exist."}}
            seed = body.get("seed")
            # torch's RNG is one per process: two servers in one test process must not reseed it
            # under each other's sampling (separate processes, as real servers are, never share it)
            with _RNG, ctx, torch.inference_mode(), torch.random.fork_rng(devices=[]):
                if seed is not None:
                    torch.manual_seed(int(seed))
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
        seq = out.sequences if want_lp else out
        new = seq[0, ids.shape[1] :].tolist()
        lps = (
            [
                float(torch.log_softmax(step[0].float(), dim=-1)[tok])
                for step, tok in zip(out.logits, new, strict=False)
            ]
            if want_lp
            else []
        )
        finish = "length"
        if self.tokenizer.eos_token_id in new:
            new = new[: new.index(self.tokenizer.eos_token_id)]
            finish = "stop"
        logprobs = (
            {
                "content": [
                    {"token": f"token_id:{t}", "logprob": lp}
                    for t, lp in zip(new, lps, strict=False)
                ]
            }
            if want_lp
            else None
        )
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [
                {
                    "index": 0,
                    "finish_reason": finish,
                    "logprobs": logprobs,
                    "message": {
                        "role": "assistant",
                        "content": self.tokenizer.decode(new, skip_special_tokens=True),
                    },
                }
            ],
            "usage": {"prompt_tokens": int(ids.shape[1]), "completion_tokens": len(new)},
        }

    # ------------------------------------------------------------------ HTTP side
    def start(self) -> AdapterServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def _send(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if self.path in ("/health", "/v1/health"):
                    self._send(200, {"status": "ok"})
                elif self.path == "/v1/models":
                    names = [server.served_name, *server.adapters]
                    self._send(
                        200,
                        {"object": "list", "data": [{"id": n, "object": "model"} for n in names]},
                    )
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    self._send(400, {"error": {"message": "invalid JSON"}})
                    return
                if self.path == "/v1/chat/completions":
                    self._send(*server.complete(body))
                elif self.path == "/v1/load_lora_adapter":
                    self._send(*server.load(str(body.get("lora_name")), str(body.get("lora_path"))))
                elif self.path == "/v1/unload_lora_adapter":
                    self._send(*server.unload(str(body.get("lora_name"))))
                elif self.path == "/collective_rpc" and server.dev_mode:
                    self._send(*server.collective_rpc(body))
                elif self.path == "/reset_prefix_cache" and server.dev_mode:
                    server.record.cache_resets += 1
                    self._send(200, {})
                else:
                    self._send(404, {"error": {"message": "not found"}})

        self._httpd = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    @property
    def base_url(self) -> str:
        assert self._httpd is not None
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    srv = AdapterServer(sys.argv[1], port=int(sys.argv[2]) if len(sys.argv) > 2 else 8000).start()
    print(f"serving {sys.argv[1]} at {srv.base_url}", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        srv.stop()
