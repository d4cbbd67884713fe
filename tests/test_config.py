"""Strict config: every mistake names the key path, the expectation and a close match."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from whale_lab.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_whale_toml_is_complete_and_matches_defaults() -> None:
    cfg = load_config(ROOT / "whale.toml")
    assert cfg == Config()
    text = (ROOT / "whale.toml").read_text()
    for section in cfg.to_dict():
        assert f"[{section}]" in text, f"whale.toml lacks [{section}]"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sampling.temprature=0.5", "sampling.temprature: unknown key (did you mean 'sampling.temperature'?)"),
        ("sampling.k=0", "sampling.k: expected a value >= 1, got 0"),
        ('model.backend="hff"', "model.backend: expected one of 'hf', 'openai', 'vllm', got 'hff' (did you mean 'hf'?)"),
        ('rsft.epochs="x"', "rsft.epochs: expected a number, got 'x'"),
        ("sampling.top_p=0", "sampling.top_p: expected a value > 0.0, got 0.0"),
        ("model.lora.rank=true", "model.lora.rank: expected an integer, got True"),
        ("modle.path=x", "modle: unknown key (did you mean 'model'?)"),
        ('model.lora.target_modules="q_proj"', "model.lora.target_modules: expected a list of a string"),
    ],
)
def test_bad_values_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_overrides_parse_toml_values() -> None:
    cfg = load_config(None, ["sampling.k=4", "domain.name=chess", "model.lora.target_modules=['q_proj']",
                             "rsft.learning_rate=2e-4", "model.lora.enabled=false"])
    assert cfg.sampling.k == 4
    assert cfg.domain.name == "chess"  # a bare word is read as a string
    assert cfg.model.lora.target_modules == ("q_proj",)
    assert cfg.rsft.learning_rate == pytest.approx(2e-4)
    assert cfg.model.lora.enabled is False


def test_config_is_frozen() -> None:
    cfg = Config()
    with pytest.raises(AttributeError):
        cfg.sampling.k = 3  # type: ignore[misc]


def test_broken_toml_file(tmp_path: Path) -> None:
    bad = tmp_path / "whale.toml"
    bad.write_text("[sampling\nk = 3\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.toml")


def test_cli_reports_config_errors_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "whale.toml"
    bad.write_text("[sampling]\ntemprature = 0.5\n")
    proc = subprocess.run([sys.executable, "-m", "whale_lab", "--config", str(bad), "eval"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "sampling.temprature: unknown key (did you mean 'sampling.temperature'?)" in proc.stderr


def test_the_old_sandbox_table_is_read_with_a_one_line_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from whale_lab.config import load_config

    p = tmp_path / "whale.toml"
    p.write_text("[harness_search.sandbox]\nmemory_mb = 777\n", encoding="utf-8")
    cfg = load_config(p)
    assert cfg.sandbox.memory_mb == 777
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "harness_search.sandbox is deprecated" in err[0]
    assert "[sandbox]" in err[0]


def test_the_new_sandbox_table_needs_no_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from whale_lab.config import load_config

    p = tmp_path / "whale.toml"
    p.write_text("[sandbox]\nmemory_mb = 778\n", encoding="utf-8")
    assert load_config(p).sandbox.memory_mb == 778
    assert capsys.readouterr().err == ""


def test_the_sandbox_table_in_both_places_is_an_error(tmp_path: Path) -> None:
    from whale_lab.config import ConfigError, load_config

    p = tmp_path / "whale.toml"
    p.write_text(
        "[sandbox]\nmemory_mb = 1000\n[harness_search.sandbox]\nmemory_mb = 2000\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="keep only \\[sandbox\\]"):
        load_config(p)


def test_a_run_config_json_with_the_old_sandbox_place_still_loads() -> None:
    from whale_lab.config import config_from_dict

    raw = {"harness_search": {"sandbox": {"memory_mb": 999}}}
    assert config_from_dict(raw).sandbox.memory_mb == 999
    assert raw == {"harness_search": {"sandbox": {"memory_mb": 999}}}  # the input is not mutated
