"""`whale-lab --help` and a config error never load torch or transformers.

Each case runs the CLI's `main` in a fresh interpreter (this process has long since loaded them)
and reports which heavy modules ended up in `sys.modules`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "peft", "vllm", "textual")

PROBE = """
import json, sys
from whale_lab.cli import main
argv, out = json.loads(sys.argv[1]), sys.argv[2]
try:
    rc = main(argv)
except SystemExit as exc:
    rc = exc.code
heavy = sorted(m for m in json.loads(sys.argv[3]) if m in sys.modules)
with open(out, "w", encoding="utf-8") as fh:
    json.dump({"rc": rc, "heavy": heavy}, fh)
"""


def _run_main(argv: list[str], tmp: Path) -> tuple[dict, str]:
    out = tmp / "probe.json"
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argv), str(out), json.dumps(HEAVY)],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.exists(), proc.stderr[-2000:]
    return json.loads(out.read_text(encoding="utf-8")), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["run", "--help"], ["eval", "--help"], ["micro", "--help"]],
    ids=["top", "run", "eval", "micro"],
)
def test_help_loads_no_heavy_module(argv: list[str], tmp_path: Path) -> None:
    got, output = _run_main(argv, tmp_path)
    assert got["rc"] == 0 and "usage: whale-lab" in output
    assert got["heavy"] == []


@pytest.mark.parametrize(
    ("argv", "config", "expect"),
    [
        (["--set", "sampling.k=0", "run", "--headless"], None, "sampling.k"),
        (["--set", 'model.backend="hff"'], None, "model.backend"),  # the app's path
        (["train"], "[rsft]\neval_every = -1\n", "rsft.eval_every"),
        (["eval"], "[eval]\ntest_every = \"sometimes\"\n", "eval.test_every"),
        (["run", "--headless"], "[sampling\nk = 2\n", "not valid TOML"),
    ],
    ids=["override", "app", "file-range", "file-choice", "file-syntax"],
)
def test_a_config_error_loads_no_heavy_module(
    argv: list[str], config: str | None, expect: str, tmp_path: Path
) -> None:
    if config is not None:
        path = tmp_path / "bad.toml"
        path.write_text(config, encoding="utf-8")
        argv = ["--config", str(path), *argv]
    else:
        argv = ["--config", str(ROOT / "whale.toml"), *argv]
    got, output = _run_main(argv, tmp_path)
    assert got["rc"] == 2 and "whale-lab: error: " in output and expect in output
    assert got["heavy"] == []
