"""`docs/results/remeasure.sh` re-runs the README's model-dependent figures: every command it would
run must be one the CLI accepts, on the model folder it was given, and a folder that is not a
model must be refused before anything runs."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "results" / "remeasure.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _planned(model: Path, out: Path, only: str = "") -> dict[str, list[str]]:
    done = subprocess.run(
        ["bash", str(SCRIPT), "-n", str(model), str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env={**os.environ, "ONLY": only},
    )
    steps: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        name, _, command = line.partition(": ")
        steps[name] = shlex.split(command)
    return steps


def test_every_planned_command_is_one_the_cli_accepts_on_the_given_model(tmp_path: Path) -> None:
    from whale_lab import cli

    model = REPO / "whale_lab" / "micro" / "model"
    out = tmp_path / "out"
    steps = _planned(model, out)
    assert not out.exists()  # a dry run writes nothing
    expected = {
        "calibrate-chess",
        "calibrate-chess-variants",
        "calibrate-math",
        "calibrate-search",
        "calibrate-math-held-out",
        "calibrate-search-held-out",
        "eval-val-math",
        "eval-val-search",
        "eval-val-chess",
        "chess-harness-split-h0",
        "chess-harness-split-calibration_strong",
        "train-math",
        "search-search",
        "probe-math",
        "compare-search",
        "compare-search-12",
        "compare-search-h64",
        "compare-math",
        "compare-chess",
        "interaction-search",
        "interaction-math",
    }
    assert set(steps) == expected
    for name, argv in steps.items():
        assert argv[0] == ".venv/bin/whale-lab", name
        args = cli.build_parser().parse_args(argv[1:])
        cli._merge_overrides(args)
        cfg = cli._load(args)
        assert Path(cfg.model.path) == model.resolve(), name
        assert Path(cfg.run.directory) == out / "runs", name
        if "--harness" in argv:
            assert (REPO / argv[argv.index("--harness") + 1]).is_file(), name
    assert "--held-out" in steps["calibrate-math-held-out"]
    assert "--chess-variants" in steps["calibrate-chess-variants"]


def test_a_folder_that_is_not_a_model_is_refused_before_anything_runs(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "nothing"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"remeasure: {tmp_path / 'nothing'}: no config.json, not a model folder"
    )
    assert not (tmp_path / "out").exists()


def test_only_runs_the_steps_it_names(tmp_path: Path) -> None:
    model = REPO / "whale_lab" / "micro" / "model"
    steps = _planned(model, tmp_path / "out", only="eval-val-chess,interaction-math")
    assert list(steps) == ["eval-val-chess", "interaction-math"]
