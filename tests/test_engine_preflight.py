"""Preflight: every server a run needs answers before its first rollout, or the run stops with one
line and ends with `run_finished` failed.

Against real servers on 127.0.0.1: an OpenAI-compatible server without vLLM's adapter endpoint
(`whale-lab run --headless` with the openai backend stops before any rollout), closed ports for
the LLM proposer and the search judge (the engine and `whale-lab train` name the endpoint and its
config key), and a judge endpoint that refuses the model name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from engine_support import ApproveAll, ParityDomain, engine_config
from servers import FaultServer, Reply, Request, echo_responder, refused_url

from whale_lab import cli
from whale_lab.backends import BackendError, make_backend
from whale_lab.config import config_from_dict
from whale_lab.engine.engine import Engine, SideEndpoint, check_endpoint, side_endpoints
from whale_lab.events import RunFinished
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore

REPO = Path(__file__).resolve().parent.parent
SEARCH_H0 = REPO / "harnesses" / "search" / "h0.py"


def no_adapter_endpoint(req: Request) -> Reply:
    """A chat server without vLLM's runtime LoRA endpoints (404, as vLLM without --enable-lora)."""
    if req.path.endswith("/load_lora_adapter") or req.path.endswith("/unload_lora_adapter"):
        return Reply(404, {"detail": "Not Found"})
    return echo_responder(req)


def ended_failed(root: Path) -> RunFinished:
    """The run's last event, which must be `run_finished` failed; no episode ran before it."""
    events = RunStore.read_events(root)
    assert not [e for e in events if e.type == "episode_finished"], "a rollout ran"
    last = events[-1]
    assert isinstance(last, RunFinished) and last.status == "failed", last
    assert RunStore(root).read_state()["status"] == "failed"
    return last


# ------------------------------------------------------------------ the model's server


def test_headless_run_against_a_server_without_the_adapter_endpoint_stops_before_any_rollout(
    tmp_path: Path, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sets: dict[str, Any] = {
        "run.directory": str(tmp_path / "runs"),
        "model.backend": "openai",
        "model.path": str(tiny_model_dir),
        "model.served_model": "tiny",
        "sampling.k": 1,
        "sampling.max_new_tokens": 4,
    }
    with FaultServer() as server:
        server.set_default(no_adapter_endpoint)
        sets["model.base_url"] = server.base_url
        args = ["run", "--headless"]
        for key, value in sets.items():
            args += ["--set", f"{key}={json.dumps(value)}"]
        args += ["--set", "domain.splits={weight = 2, harness = 1, val = 1, test = 1}"]
        code = cli.main(args)
        chats = [r.json for r in server.requests_to("/chat/completions")]
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("whale-lab: error:")]
    assert len(errors) == 1, err
    assert "does not support runtime LoRA adapters" in errors[0] and "--enable-lora" in errors[0]
    assert server.base_url.removesuffix("/v1") in errors[0]
    # that one line is all: the headless display leaves a failed run's end to the error line
    others = [line for line in err.splitlines() if line.strip() and line not in errors]
    assert not others, err
    # only preflight's one-token request reached the chat endpoint: no evaluation, no rollout
    assert chats and all(c["max_tokens"] == 1 for c in chats)
    (run,) = (tmp_path / "runs").iterdir()
    assert "runtime LoRA adapters" in ended_failed(run).message


# ------------------------------------------------------------------ the proposer and the judge


def engine_run(cfg: Any, root: Path, domain: Any = None) -> Engine:
    """An engine over the tiny hf backend (nothing to preflight there)."""
    return Engine(
        cfg,
        RunStore(root),
        reviewer=ApproveAll(),
        commands=CommandChannel(),
        backend=make_backend(cfg),
        domain=domain,
    )


def test_an_llm_proposer_on_a_closed_port_stops_the_engine_before_any_rollout(
    tmp_path: Path,
) -> None:
    url = refused_url()
    cfg = engine_config(tmp_path, proposer={"kind": "llm", "base_url": url, "model": "m"})
    engine = engine_run(cfg, tmp_path / "run", ParityDomain())
    with pytest.raises(BackendError) as info:
        engine.run()
    msg = str(info.value)
    assert "\n" not in msg
    assert f"the LLM proposer endpoint {url} (proposer.base_url)" in msg
    assert "connection refused" in msg
    assert msg in ended_failed(tmp_path / "run").message


def test_a_search_judge_on_a_closed_port_stops_the_engine_before_any_rollout(
    tmp_path: Path,
) -> None:
    url = refused_url()
    cfg = engine_config(
        tmp_path,
        domain={
            "name": "search",
            "harness": str(SEARCH_H0),
            "splits": {"weight": 4, "harness": 2, "val": 2, "test": 2},
            "judge": {"enabled": True, "base_url": url, "model": "judge"},
        },
    )
    engine = engine_run(cfg, tmp_path / "run")  # the engine makes the search domain itself
    with pytest.raises(BackendError) as info:
        engine.run()
    msg = str(info.value)
    assert "\n" not in msg
    assert f"the search judge endpoint {url} (domain.judge.base_url)" in msg
    ended_failed(tmp_path / "run")


def test_train_preflights_the_search_judge_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from whale_lab.commands.train import run_train

    url = refused_url()
    cfg = config_from_dict(
        {
            "model": {"path": "tiny-random"},
            "domain": {
                "name": "search",
                "splits": {"weight": 2, "harness": 1, "val": 1, "test": 1},
                "judge": {"enabled": True, "base_url": url, "model": "judge"},
            },
            "sampling": {"k": 1, "max_new_tokens": 4},
        }
    )
    assert run_train(cfg, run_dir=tmp_path / "run", progress=False) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "(domain.judge.base_url)" in err and url in err
    ended_failed(tmp_path / "run")


def test_which_endpoints_a_run_preflights() -> None:
    def cfg(**proposer: Any) -> Any:
        return config_from_dict({"proposer": {"kind": "llm", "model": "m", **proposer}})

    assert [e.table for e in side_endpoints(cfg(), proposer=True)] == ["proposer"]
    assert side_endpoints(cfg(), proposer=False) == []  # no harness phase asks it
    assert side_endpoints(cfg(replay="runs/old"), proposer=True) == []  # replayed: no requests
    assert side_endpoints(config_from_dict({}), proposer=True) == []  # the rules proposer
    judge = config_from_dict(
        {"domain": {"name": "search", "judge": {"enabled": True, "model": "j"}}}
    )
    assert [e.table for e in side_endpoints(judge, proposer=False)] == ["domain.judge"]


def test_an_endpoint_that_refuses_the_model_is_one_line_naming_the_keys() -> None:
    def refuse_unknown(req: Request) -> Reply:
        if (req.json or {}).get("model") != "served":
            return Reply.error(404, "The model `wrong` does not exist.")
        return echo_responder(req)

    with FaultServer() as server:
        server.set_default(refuse_unknown)

        def endpoint(model: str) -> SideEndpoint:
            return SideEndpoint("search judge", "domain.judge", server.base_url, model, "", 5.0)

        check_endpoint(endpoint("served"))  # answers: nothing to say
        with pytest.raises(BackendError) as info:
            check_endpoint(endpoint("wrong"))
        with pytest.raises(BackendError, match=r"domain\.judge\.model is empty"):
            check_endpoint(endpoint(""))
    msg = str(info.value)
    assert "\n" not in msg and "HTTP 404" in msg and "does not exist" in msg
    assert "model 'wrong' (domain.judge.model)" in msg and "(domain.judge.base_url)" in msg
