"""`whale-lab check`: what this machine gives untrusted code, before anyone trusts a result.

Prints the confinement in force (bwrap with its guarantees, or why not and what the config allows)
and, with `--attack`, runs a few escapes as model tool code (which no AST check filters, so
the OS is the only boundary) and says whether each was stopped. Exit 0 when untrusted code would run confined, 2 when it would be
refused here, 1 when it would run unconfined because the config allows it.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from whale_lab import confine
from whale_lab.config import Config

# Each attack must fail; `leak` is what would be printed if it succeeded.
_TOOL_ATTACKS: tuple[tuple[str, str], ...] = (
    ("read the engine's environment", "import os\nprint(os.environ.get('WHALE_LAB_CHECK_CANARY'))"),
    ("import whale_lab", "import whale_lab\nprint('imported')"),
    (
        "open a network socket",
        "import socket\ns=socket.create_connection(('1.1.1.1', 53), 1)\nprint('connected')",
    ),
    ("start a process", "import os\nprint('forked' if os.fork() else '')"),
)
_CANARY = "whale-lab-check-canary-7f3a"


def _attacks(cfg: Config) -> list[dict[str, Any]]:
    import os

    os.environ["WHALE_LAB_CHECK_CANARY"] = _CANARY
    with tempfile.TemporaryDirectory() as tmp:
        secret = Path(tmp) / "answers.txt"
        secret.write_text(_CANARY, encoding="utf-8")
        return _run(
            cfg,
            _TOOL_ATTACKS
            + (("read a file outside the sandbox", f"print(open({str(secret)!r}).read())"),),
        )


def _run(cfg: Config, attacks: tuple[tuple[str, str], ...]) -> list[dict[str, Any]]:
    from whale_lab.domains.interpreter import InterpreterLimits, run_python

    limits = InterpreterLimits(allow_unconfined=cfg.sandbox.allow_unconfined)
    out = []
    for name, code in attacks:
        result = run_python(code, limits)
        text = f"{result.stdout}\n{result.error}"
        leaked = _CANARY in text or "imported" in result.stdout or "connected" in result.stdout
        leaked = leaked or "forked" in result.stdout
        out.append({"attack": name, "stopped": not leaked, "detail": text.strip()[-160:]})
    return out


def run_check(cfg: Config, *, attack: bool = False, as_json: bool = False) -> int:
    conf = confine.detect()
    allowed = confine.unconfined_allowed(cfg.sandbox.allow_unconfined)
    if conf.confined:
        verdict, code = "untrusted code runs confined", 0
    elif allowed:
        verdict, code = "untrusted code runs UNCONFINED (allowed by sandbox.allow_unconfined)", 1
    else:
        verdict, code = "untrusted code is refused here (sandbox.allow_unconfined is false)", 2
    report: dict[str, Any] = {
        "confined": conf.confined,
        "sandbox": conf.describe(),
        "verdict": verdict,
        "limits": {
            "call_timeout_s": cfg.sandbox.call_timeout_s,
            "memory_mb": cfg.sandbox.memory_mb,
            "cpu_seconds": cfg.sandbox.cpu_seconds,
            "max_output_chars": cfg.sandbox.max_output_chars,
        },
    }
    if attack and code != 2:
        report["attacks"] = _attacks(cfg)
        if not all(a["stopped"] for a in report["attacks"]):
            code = max(code, 1)
    if as_json:
        print(json.dumps(report, indent=2))
        return code
    print(f"sandbox: {report['sandbox']}")
    print(f"verdict: {verdict}")
    limits = report["limits"]
    print(
        f"limits:  {limits['call_timeout_s']:g} s per harness call, {limits['memory_mb']} MB, "
        f"{limits['cpu_seconds']} CPU s, {limits['max_output_chars']} output chars"
    )
    for a in report.get("attacks", []):
        mark = "stopped" if a["stopped"] else "NOT STOPPED"
        print(f"  {mark:>11}  {a['attack']}")
    return code
