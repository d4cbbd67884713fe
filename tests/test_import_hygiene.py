"""The TUI imports no ML stack at module level, and nothing outside the TUI imports textual.

Each check runs in a fresh interpreter and inspects `sys.modules`.
"""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import whale_lab

HEAVY = ("torch", "transformers", "peft", "vllm")
# Everything the engine side is made of: these must never pull in textual.
ENGINE_SIDE = (
    "engine",
    "weights",
    "search",
    "domains",
    "backends",
    "harness",
    "micro",
    "presets",
    "commands",
)
ENGINE_MODULES = (
    "seams",
    "reviewers",
    "context",
    "errors",
    "rollout",
    "metrics",
    "evaluate",
    "store",
    "events",
    "config",
    "trace",
    "models",
    "quiet",
)


def _loaded_after(code: str) -> set[str]:
    script = (
        "import json, sys\n"
        f"{code}\n"
        "print(json.dumps(sorted(m.split('.')[0] for m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_tui_imports_no_ml_stack() -> None:
    loaded = _loaded_after("import whale_lab.tui.app, whale_lab.tui, whale_lab.tui.state")
    assert "textual" in loaded
    assert not (set(HEAVY) & loaded), sorted(set(HEAVY) & loaded)


def engine_side_modules() -> list[str]:
    root = Path(whale_lab.__file__).parent
    names = [f"whale_lab.{m}" for m in ENGINE_MODULES if (root / f"{m}.py").exists()]
    for pkg in ENGINE_SIDE:
        if not (root / pkg / "__init__.py").exists():
            continue
        names.append(f"whale_lab.{pkg}")
        for info in pkgutil.walk_packages([str(root / pkg)], prefix=f"whale_lab.{pkg}."):
            names.append(info.name)
    return names


def test_engine_side_imports_no_textual() -> None:
    modules = engine_side_modules()
    assert "whale_lab.engine.engine" in modules and "whale_lab.seams" in modules
    assert "whale_lab.context" in modules and "whale_lab.engine.safepoints" in modules
    code = (
        "import importlib\n"
        "skipped = []\n"
        f"for name in {modules!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        if exc.name and exc.name.split('.')[0] in ('vllm',):\n"
        "            skipped.append(name)\n"
        "            continue\n"
        "        raise\n"
    )
    loaded = _loaded_after(code)
    assert "textual" not in loaded
    assert "textual_plotext" not in loaded
