"""`whale-lab probe --interaction --run RUN` on a real (tiny) whale run: four cells on val, the
run's weights put back, the result in the run's log; unsuitable runs get one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_compare import short_config

from whale_lab.commands.common import EXIT_OK, EXIT_USAGE
from whale_lab.commands.probe import run_interaction_probe
from whale_lab.commands.run import run_headless
from whale_lab.engine.engine import open_engine
from whale_lab.engine.headless import headless_config
from whale_lab.engine.interaction import run_interaction
from whale_lab.reviewers import AutoReviewer
from whale_lab.seams import CommandChannel
from whale_lab.store import RunStore, read_json


@pytest.mark.timeout(600)
def test_the_interaction_probe_on_a_whale_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = short_config(tmp_path, 'schedule.kind="whale"', "domain.splits.val=6")
    assert run_headless(cfg) == EXIT_OK
    (run,) = list((tmp_path / "runs").iterdir())
    capsys.readouterr()
    state_before = read_json(run / "state.json")
    assert run_interaction_probe(cfg, str(run), as_json=True) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    k, n_val = 2, 6
    assert set(out["cells"]) == {
        "incumbent/before",
        "candidate/before",
        "incumbent/after",
        "candidate/after",
    }
    assert out["rollouts"] == 4 * n_val * k
    assert out["n_tasks"] == n_val and out["method"] == "percentile bootstrap over tasks"
    for key in ("gain_before", "gain_after", "interaction"):
        assert len(out[key]["interval"]) == 2 and out[key]["n_tasks"] == n_val
    assert out["verdict"] in ("positive", "negative", "inconclusive")
    # the weights: the start and the end of the last weight phase (cycle 2)
    phases = [p for p in state_before["phases"] if p["kind"] == "weight"]
    assert out["steps"] == [phases[-1]["start_step"], phases[-1]["end_step"]]
    assert out["weight_cycle"] == 2 and out["harness_cycle"] == 1
    # the gains are differences of the cells; the interaction is their difference
    c = out["cells"]
    assert out["gain_before"]["diff"] == pytest.approx(
        c["candidate/before"] - c["incumbent/before"]
    )
    assert out["gain_after"]["diff"] == pytest.approx(c["candidate/after"] - c["incumbent/after"])
    assert out["interaction"]["diff"] == pytest.approx(
        out["gain_after"]["diff"] - out["gain_before"]["diff"]
    )
    # nothing the run selected, accepted or trained changed
    after = read_json(run / "state.json")
    assert after["harness"] == state_before["harness"] and after["best"] == state_before["best"]
    events = RunStore.read_events(run)
    result = [e for e in events if e.type == "interaction_result"][-1]
    assert result.verdict == out["verdict"] and result.cells == out["cells"]
    assert result.interaction["interval"] == out["interaction"]["interval"]
    assert result.steps == tuple(out["steps"]) and result.text == out["text"]
    assert (run / out["folder"] / "interaction.json").is_file()
    probe_eps = [e for e in events if e.type == "episode_finished" and e.phase == "probe"]
    assert len(probe_eps) == out["rollouts"]
    # in one process: the run's own weights are back in the model after the probe, and the
    # probe measures the same cells again (same checkpoints, same val seeds)
    engine, store = open_engine(
        headless_config(cfg), run, reviewer=AutoReviewer(), commands=CommandChannel()
    )
    try:
        tm = engine.phases.weights().tm
        with torch.no_grad():  # weights in the model that no checkpoint holds
            for _n, p in tm.named_trainable():
                p.add_(torch.randn_like(p) * 0.01)
        then = {n: p.detach().clone() for n, p in tm.named_trainable()}
        again = run_interaction(engine)
        assert all(torch.equal(then[n], p) for n, p in tm.named_trainable())
    finally:
        engine.ctx.backend.close()
        store.close()
    assert again["cells"] == out["cells"] and again["index"] == out["index"] + 1


def test_the_interaction_probe_refuses_a_run_without_both_phases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = short_config(tmp_path, 'schedule.kind="weight-only"')
    assert run_headless(cfg) == EXIT_OK
    (run,) = list((tmp_path / "runs").iterdir())
    capsys.readouterr()
    assert run_interaction_probe(cfg, str(run)) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "needs an ended weight phase and an ended harness phase" in err
    assert err.count("\n") == 1
    assert run_interaction_probe(cfg, None) == EXIT_USAGE
    assert "--run RUN" in capsys.readouterr().err
