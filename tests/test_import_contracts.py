"""The import contracts in pyproject.toml hold: arrows point down (checked by import-linter)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    assert found, "lint-imports not installed: `pip install -e '.[test]'` brings import-linter"
    return found


def test_every_import_contract_is_kept() -> None:
    proc = subprocess.run(
        [_lint_imports(), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "0 broken" in out
    assert "harness code never sees the domains" in out and "KEPT" in out


def test_the_contracts_name_every_layer_of_the_design() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    for room in ("whale_lab.tui", "whale_lab.engine", "whale_lab.weights | whale_lab.search",
                 "whale_lab.harness | whale_lab.domains | whale_lab.backends", "whale_lab.seams"):
        assert room in text
