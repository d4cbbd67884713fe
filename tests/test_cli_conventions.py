"""The command line's conventions: `--version`, `eval --json` with a schema version and paths a
user can type, and the exit codes the README documents (0 done, 2 a user's mistake; 130 and 143
for SIGINT and SIGTERM are checked on real processes in test_signals.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from whale_lab import __version__
from whale_lab.cli import main
from whale_lab.commands.eval import EVAL_SCHEMA

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"whale-lab {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["--set", "nosuch.key=1", "eval"],
        ["--set", "sampling.k=-3", "eval"],
        ["tui", "--run", "no/such/run", "--view"],
        ["eval", "--harness", "no/such/harness.py", "--limit", "1"],
    ],
)
def test_a_users_mistake_is_one_line_and_exit_code_2(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["--set", f'run.directory="{tmp_path / "runs"}"', *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err and len(err.splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("argv", "k", "split_val"),
    [
        (["--set", "sampling.k=3", "eval", "--set", "domain.splits.val=5"], 3, 5),
        (["--set", "sampling.k=3", "eval", "--set", "sampling.k=6"], 6, None),
        (["eval", "--set", "sampling.k=6"], 6, None),
        (["--set", "sampling.k=3", "--set", "domain.splits.val=5", "eval"], 3, 5),
        (["--set", "sampling.k=3", "micro", "calibrate", "--set", "domain.splits.val=5"], 3, 5),
        (["--set", "sampling.k=3", "search", "--set", 'approval.mode="auto"'], 3, None),
    ],
)
def test_set_before_and_after_the_subcommand_both_count(
    argv: list[str], k: int, split_val: int | None
) -> None:
    """argparse hands a subcommand's own `--set` list over the one given before it; both must
    reach the config (a later one wins on the same key), or a model path set before the
    subcommand is silently dropped by a `--set` after it."""
    from whale_lab import cli

    args = cli.build_parser().parse_args(argv)
    cli._merge_overrides(args)
    cfg = cli._load(args)
    assert cfg.sampling.k == k
    if split_val is not None:
        assert cfg.domain.splits.val == split_val


def test_a_model_path_set_before_the_subcommand_is_not_dropped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    argv = ["--set", 'model.path="/no/such/model"', "eval", "--set", "sampling.k=1"]
    assert main([*argv, "--domain", "chess", "--limit", "1"]) == 2
    assert "/no/such/model" in capsys.readouterr().err


def test_a_wrong_option_is_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["eval", "--split", "nosuch"])
    assert done.value.code == 2


def test_eval_json_has_a_schema_and_paths_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    shutil.copyfile(REPO / "harnesses" / "math" / "h0.py", tmp_path / "mine.py")
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "--config",
            str(REPO / "whale.toml"),
            "--set",
            'run.directory="runs"',
            "eval",
            "--domain",
            "math",
            "--harness",
            "mine.py",
            "--k",
            "1",
            "--limit",
            "2",
            "--json",
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["schema"] == EVAL_SCHEMA == 1
    assert result["harness"] == "mine.py"
    run_dir = Path(result["run_dir"])
    assert not run_dir.is_absolute() and run_dir.parts[0] == "runs"
    assert (tmp_path / run_dir / "eval.json").exists()
    assert json.loads((tmp_path / run_dir / "eval.json").read_text()) == result
    assert result["rollouts"] == 2 and result["k"] == 1
