"""`whale-lab train` (run_train): a whole weight-only run, Ctrl-C and resume, and clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from whale_lab.commands.train import run_train
from whale_lab.config import EvalConfig, config_from_dict
from whale_lab.events import EvalResult, RunFinished, RunStarted, WeightStep
from whale_lab.store import RunStore, read_json

MATH_TINY: dict[str, Any] = {
    "model": {"path": "tiny-random"},
    "domain": {"name": "math", "splits": {"weight": 4, "harness": 1, "val": 2, "test": 2}},
    "sampling": {"max_new_tokens": 8, "k": 2},
    "rsft": {"prompts_per_step": 2, "samples_per_prompt": 2, "epochs": 1.0, "eval_every": 0.5},
}


def math_cfg(**rsft: Any) -> Any:
    data = json.loads(json.dumps(MATH_TINY))
    data["rsft"].update(rsft)
    return config_from_dict(data)


def test_train_runs_the_budget_evaluates_and_refuses_to_redo_a_finished_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    cfg = math_cfg().replace(eval=EvalConfig(test_every="always"))  # val and test at every point
    assert run_train(cfg, run_dir=run, progress=False) == 0
    events = RunStore.read_events(run)
    started = [e for e in events if isinstance(e, RunStarted)]
    assert len(started) == 1 and started[0].schedule == "weight-only" and not started[0].resumed
    assert [e.step for e in events if isinstance(e, WeightStep)] == [1, 2]
    val = [e for e in events if isinstance(e, EvalResult) and e.split == "val"]
    assert [Path(e.checkpoint).name for e in val] == ["step-000000", "step-000001", "step-000002"]
    assert [e.status for e in events if isinstance(e, RunFinished)] == ["completed"]
    state = read_json(run / "state.json")
    assert state["status"] == "completed" and state["step"] == 2 and len(state["evals"]) == 3
    assert (run / "harness" / "h0.py").read_text() == Path("harnesses/math/h0.py").read_text()
    out = capsys.readouterr()
    assert "best by val" in out.out and f"run: {run}" in out.out

    assert run_train(cfg, run_dir=run, resume=True, progress=False) == 0
    assert "already complete" in capsys.readouterr().err
    assert len([e for e in RunStore.read_events(run) if isinstance(e, WeightStep)]) == 2

    # Killed after the last step but before the run was marked complete: nothing is redone.
    (run / "state.json").write_text(json.dumps({**state, "status": "stopped"}))
    assert run_train(cfg, run_dir=run, resume=True, progress=False) == 0
    events = RunStore.read_events(run)
    assert len([e for e in events if isinstance(e, WeightStep)]) == 2
    assert len([e for e in events if isinstance(e, EvalResult)]) == 6
    assert read_json(run / "state.json")["status"] == "completed"


def test_ctrl_c_stops_at_a_safe_point_and_resume_finishes_the_budget(tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = (
        "import json, sys\n"
        "from whale_lab.config import config_from_dict\n"
        "from whale_lab.commands.train import run_train\n"
        "cfg = config_from_dict(json.loads(sys.argv[1]))\n"
        "sys.exit(run_train(cfg, run_dir=sys.argv[2], progress=True))\n"
    )
    data = json.loads(json.dumps(MATH_TINY))
    data["domain"]["splits"]["weight"] = 16  # 8 steps: time to interrupt
    data["rsft"]["eval_every"] = 10.0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", script, json.dumps(data), str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / "traces" / "weight.jsonl").exists() and proc.poll() is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "resume with: whale-lab train --resume" in err and "Traceback" not in err
    stopped_at = read_json(run / "state.json")["step"]
    assert read_json(run / "state.json")["status"] == "stopped" and stopped_at < 8

    assert run_train(config_from_dict(data), run_dir=run, resume=True, progress=False) == 0
    events = RunStore.read_events(run)
    steps = [e.step for e in events if isinstance(e, WeightStep)]
    assert steps == list(range(1, 9))  # no step lost, none done twice
    assert [e.resumed for e in events if isinstance(e, RunStarted)] == [False, True]
    epochs = [e.epoch for e in events if isinstance(e, WeightStep)]
    assert epochs[-1] == 1.0


def test_unusable_model_adapter_or_run_folder_give_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], tiny_model_dir: Path
) -> None:
    def fails(expected: str, *args: Any, **kwargs: Any) -> None:
        assert run_train(*args, progress=False, **kwargs) == 2
        err = capsys.readouterr().err
        assert expected in err and "Traceback" not in err, err

    data = json.loads(json.dumps(MATH_TINY))
    data["model"]["path"] = str(tmp_path / "nowhere")
    fails("does not exist", config_from_dict(data), run_dir=tmp_path / "a")

    broken = tmp_path / "broken-model"
    broken.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.suffix in (".json", ".jinja"):
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    data["model"]["path"] = str(broken)
    fails("cannot load the model", config_from_dict(data), run_dir=tmp_path / "b")

    fails("adapter folder", math_cfg(), run_dir=tmp_path / "c", adapter=str(tmp_path / "none"))
    fails("not a whale-lab train run", math_cfg(), run_dir=tmp_path / "none", resume=True)

    # A run whose newest resume point was damaged on disk.
    run = tmp_path / "d"
    assert run_train(math_cfg(epochs=0.5), run_dir=run, progress=False) == 0
    capsys.readouterr()
    state = read_json(run / "state.json")
    (run / "state.json").write_text(json.dumps({**state, "status": "stopped"}))
    latest = read_json(run / "weights" / "latest.json")
    (run / "weights" / latest["dir"] / "trainable.safetensors").write_bytes(b"torn")
    fails("cannot read", math_cfg(), run_dir=run, resume=True)
