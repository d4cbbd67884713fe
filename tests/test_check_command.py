"""`whale-lab check` says which sandbox is in force, and its attacks are stopped where it confines."""

from __future__ import annotations

import json

import pytest

from whale_lab import confine
from whale_lab.cli import main

CONF = confine.detect()


@pytest.mark.skipif(not CONF.confined, reason=f"bwrap cannot confine here: {CONF.reason}")
def test_check_reports_confinement_and_every_attack_is_stopped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--attack", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["confined"] is True and "bwrap" in report["sandbox"]
    assert len(report["attacks"]) >= 5
    assert all(a["stopped"] for a in report["attacks"]), report["attacks"]


def test_check_says_untrusted_code_is_refused_without_confinement(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(confine, "_detected", confine.Confinement(False, reason="test: no userns"))
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    assert main(["check"]) == 2
    out = capsys.readouterr().out
    assert "refused here" in out and "test: no userns" in out
    assert main(["check", "--set", "sandbox.allow_unconfined=true"]) == 1
    assert "UNCONFINED" in capsys.readouterr().out
