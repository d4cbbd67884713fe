"""Malformed configs end as one line naming the key (or the file): no traceback, no hang.

The cases are generated from the config's own dataclasses, so a new field is fuzzed as soon as it
exists: every numeric key with NaN, +-inf, a huge value, a negative one and wrong types; every
choice, flag, text and list key with wrong values; unknown keys and wrong table types in every
section; non-UTF-8 bytes, deep nesting, bad devices, a `run.directory` that is a file, broken TOML.
Most run in process through `whale_lab.cli.main` exactly as a user types them (`whale-lab --config
FILE eval --limit 1`, which fails while reading the config); a few run as real subprocesses.
The device and LoRA checks that need torch run last, on a fake CUDA build and a small module.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_origin

import pytest

from whale_lab.cli import main
from whale_lab.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parent.parent
DEEP = 5000


@dataclass(frozen=True)
class Case:
    id: str
    expect: str  # what the one stderr line must name: the key path or the file
    toml: bytes = b""  # the config file's bytes
    sets: tuple[str, ...] = ()  # --set overrides given on the command line
    config: str = ""  # "dir": --config names a folder; "missing": a file that does not exist


# ------------------------------------------------------------------ generating the cases


def _fields(cls: type = Config, prefix: str = "") -> Iterator[tuple[str, Any, dict]]:
    """(dotted key path, type, metadata) of every leaf field of the config."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            yield from _fields(tp, path + ".")
        else:
            yield path, tp, dict(f.metadata)


def _sections(cls: type = Config, prefix: str = "") -> Iterator[str]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            yield f"{prefix}{f.name}"
            yield from _sections(hints[f.name], f"{prefix}{f.name}.")


def _toml_at(path: str, value: str) -> bytes:
    table, _, key = path.rpartition(".")
    head = f"[{table}]\n" if table else ""
    return f"{head}{key} = {value}\n".encode()


NUMERIC_VALUES = {
    "nan": "nan",
    "inf": "inf",
    "-inf": "-inf",
    "huge": "1e308",
    "beyond-int64": str(2**63),
    "beyond-float": "1" + "0" * 400,
    "negative": "-1000000000",
    "string": '"12"',
    "bool": "true",
    "list": "[1]",
    "table": "{ a = 1 }",
}


def _cases() -> list[Case]:
    out: list[Case] = []
    for path, tp, _meta in _fields():
        if tp in (int, float):
            for name, value in NUMERIC_VALUES.items():
                if name == "beyond-int64" and tp is float:
                    continue  # "huge" and "beyond-float" cover floats
                out.append(Case(f"{path}={name}", path, _toml_at(path, value)))
            if tp is int:
                out.append(Case(f"{path}=float", path, _toml_at(path, "1.5")))
        elif get_origin(tp) is Literal:
            out.append(Case(f"{path}=unknown-choice", path, _toml_at(path, '"nope"')))
            out.append(Case(f"{path}=number", path, _toml_at(path, "1")))
        elif tp is bool:
            out.append(Case(f"{path}=string", path, _toml_at(path, '"yes"')))
            out.append(Case(f"{path}=number", path, _toml_at(path, "1")))
        elif tp is str:
            out.append(Case(f"{path}=number", path, _toml_at(path, "1")))
            out.append(Case(f"{path}=table", path, _toml_at(path, "{ a = 1 }")))
        elif get_origin(tp) is tuple:
            out.append(Case(f"{path}=string", path, _toml_at(path, '"q_proj"')))
            out.append(Case(f"{path}=numbers", path, _toml_at(path, "[1, 2]")))
            deep = "[" * DEEP + "]" * DEEP
            out.append(Case(f"{path}=deep", "whale.toml", _toml_at(path, deep)))
    for section in _sections():
        out.append(Case(f"{section}.unknown-key", f"{section}.no_such_key",
                        _toml_at(f"{section}.no_such_key", "1")))
        out.append(Case(f"{section}=scalar", section, _toml_at(section, "5")))
        out.append(Case(f"{section}=list", section, _toml_at(section, "[1, 2]")))
    out.append(Case("top-level-typo", "modle", b"[modle]\npath = 'x'\n"))
    out.append(Case("odd-key-newline", "sampling.", b'[sampling]\n"tem\\nperature" = 1.0\n'))
    # model.device: the form is checked with the config, before torch is imported
    for bad in ("", "banana", "CPU", "gpu", "cuda:", "cuda:-1", "cuda:x", "cuda:1.5", "cuda:00",
                "cuda:123456", " cpu", "cpu\n", "cuda 0", "mps:0", "auto:1"):
        out.append(Case(f"device={bad!r}", "model.device", _toml_at("model.device", repr_toml(bad))))
    # the bytes of the file
    for name, data in {
        "latin1": "[run]\nname = 'caf\xe9'\n".encode("latin-1"),
        "ff-first": b"\xff[run]\n",
        "bad-continuation": b"[run]\nname = 'a\xc3\x28b'\n",
        "utf16": "[run]\nname = 'x'\n".encode("utf-16"),
        "bom-then-bad": b"\xef\xbb\xbf[run]\nname = '\x80'\n",
        "truncated-utf8": b"[run]\nname = 'a\xe2\x82'\n",
    }.items():
        out.append(Case(f"non-utf8-{name}", "not UTF-8", data))
    # nesting that overflows the recursive TOML parser
    for name, text in {
        "arrays": "x = " + "[" * DEEP + "]" * DEEP,
        "inline-tables": "x = " + "{a = " * DEEP + "1" + "}" * DEEP,
        "mixed": "x = " + "[{a = " * (DEEP // 2) + "1" + "}]" * (DEEP // 2),
        "in-a-known-key": "[model.lora]\ntarget_modules = " + "[" * DEEP + "]" * DEEP,
        "unclosed": "x = " + "[" * DEEP,
    }.items():
        out.append(Case(f"deep-{name}", "whale.toml", text.encode()))
    # broken TOML
    for name, text in {
        "unclosed-table": "[sampling\nk = 3\n",
        "no-value": "[run]\nseed =\n",
        "no-key": "= 1\n",
        "duplicate-key": "[run]\nseed = 1\nseed = 2\n",
        "duplicate-table": "[run]\n[run]\n",
        "nul-byte": "[run]\nname = 'a\x00b'\n",
        "bad-escape": '[run]\nname = "\\q"\n',
        "bare-word": "[run]\nname = hello\n",
    }.items():
        out.append(Case(f"toml-{name}", "not valid TOML", text.encode()))
    # --set overrides, as typed on the command line
    for path, value in (("sampling.temperature", "nan"), ("sandbox.call_timeout_s", "inf"),
                        ("sandbox.call_timeout_s", "1e308"), ("run.seed", str(2**64)),
                        ("domain.splits.weight", "1000000000"), ("model.device", '"banana"'),
                        ("model.device", '""'), ("sampling.tempreature", "0.5"),
                        ("model.lora.target_modules", "[" * DEEP + "]" * DEEP)):
        out.append(Case(f"set-{path}={value[:12]}", path, sets=(f"{path}={value}",)))
    out.append(Case("set-into-a-scalar", "run.seed", sets=("run=5", "run.seed=1")))
    out.append(Case("set-without-equals", "sampling.k", sets=("sampling.k",)))
    # the config path itself
    out.append(Case("config-is-a-folder", "is a folder", config="dir"))
    out.append(Case("config-missing", "config file not found", config="missing"))
    return out


def repr_toml(text: str) -> str:
    """A TOML basic string holding `text` exactly."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


CASES = _cases()


def _argv(case: Case, tmp_path: Path) -> list[str]:
    if case.config == "dir":
        return ["--config", str(tmp_path), "eval", "--limit", "1"]
    if case.config == "missing":
        return ["--config", str(tmp_path / "nope.toml"), "eval", "--limit", "1"]
    path = tmp_path / "whale.toml"
    path.write_bytes(case.toml)
    argv = ["--config", str(path)]
    for item in case.sets:
        argv += ["--set", item]
    return argv + ["eval", "--limit", "1"]


def _check_one_line(rc: int, out: str, err: str, case: Case) -> None:
    lines = err.strip().splitlines()
    assert rc == 2, f"{case.id}: exit {rc}; stderr: {err[-500:]}"
    assert "Traceback" not in err, err[-2000:]
    assert len(lines) == 1, f"{case.id}: {len(lines)} lines on stderr: {err[-1000:]}"
    assert lines[0].startswith("whale-lab: error: "), lines[0]
    assert case.expect in lines[0], f"{case.id}: {case.expect!r} not in {lines[0]!r}"
    assert out == "", out


# ------------------------------------------------------------------ in process


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 150
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_config_is_one_line(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc = main(_argv(case, tmp_path))
    captured = capsys.readouterr()
    _check_one_line(rc, captured.out, captured.err, case)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("where", ["file", "below-a-file"])
def test_run_directory_that_is_a_file(
    where: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "runs"
    blocker.write_text("not a folder\n")
    target = blocker if where == "file" else blocker / "deeper"
    cfg = tmp_path / "whale.toml"
    cfg.write_text(f"[run]\ndirectory = {repr_toml(str(target))}\n")
    rc = main(["--config", str(cfg), "eval", "--limit", "1"])
    captured = capsys.readouterr()
    _check_one_line(rc, captured.out, captured.err, Case(where, "run.directory"))
    assert str(blocker) in captured.err


def test_good_values_still_load(tmp_path: Path) -> None:
    """The bounds leave real configs alone: the shipped file, a BOM, the device forms, big sizes."""
    assert load_config(ROOT / "whale.toml") == Config()
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbf[run]\nseed = 9223372036854775807\n")
    assert load_config(bom).run.seed == 2**63 - 1
    for device in ("auto", "cpu", "cuda", "cuda:0", "cuda:7", "mps"):
        assert load_config(None, [f'model.device="{device}"']).model.device == device
    cfg = load_config(None, ["domain.splits.weight=10000000", "sandbox.call_timeout_s=86400",
                             f'run.directory="{tmp_path / "new" / "runs"}"'])
    assert cfg.domain.splits.weight == 10_000_000


def test_messages_name_range_and_value() -> None:
    for override, message in [
        ("sampling.temperature=nan", "sampling.temperature: expected a finite number, got nan"),
        ("sandbox.call_timeout_s=-inf", "sandbox.call_timeout_s: expected a finite number, got -inf"),
        ("sandbox.call_timeout_s=1e308", "sandbox.call_timeout_s: expected a value <= 86400.0, got 1e+308"),
        (f"run.seed={2**63}", f"run.seed: expected a value <= {2**63 - 1}, got {2**63}"),
        ("domain.splits.val=20000000", "domain.splits.val: expected a value <= 10000000, got 20000000"),
        ('model.device="banana"', "model.device: expected auto, cpu, cuda, cuda:N or mps, got 'banana'"),
        ('model.device="CPU"', "(did you mean 'cpu'?)"),
    ]:
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert message in str(err.value)
        assert "\n" not in str(err.value)


def test_non_utf8_names_file_and_byte_offset(tmp_path: Path) -> None:
    p = tmp_path / "whale.toml"
    p.write_bytes(b"[run]\nname = 'caf\xe9'\n")
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert str(err.value) == (
        f"{p}: not UTF-8 text: byte 0xe9 at offset 17 (line 2); save the config as UTF-8"
    )


# ------------------------------------------------------------------ real subprocesses

SUBPROCESS = {
    "nan": ("sampling.temperature", b"[sampling]\ntemperature = nan\n"),
    "latin1": ("not UTF-8", "[run]\nname = 'caf\xe9'\n".encode("latin-1")),
    "deep": ("nested too deeply", ("x = " + "[" * DEEP + "]" * DEEP).encode()),
    "device": ("model.device", b"[model]\ndevice = 'banana'\n"),
    "seed": ("run.seed", f"[run]\nseed = {2**64}\n".encode()),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", list(SUBPROCESS))
def test_as_a_user_runs_it(name: str, tmp_path: Path) -> None:
    expect, data = SUBPROCESS[name]
    path = tmp_path / "whale.toml"
    path.write_bytes(data)
    env = {k: v for k, v in os.environ.items() if k != "WHALE_LAB_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "whale_lab", "--config", str(path), "eval", "--limit", "1"],
        capture_output=True, text=True, timeout=50, cwd=tmp_path, env=env,
    )
    _check_one_line(proc.returncode, proc.stdout, proc.stderr, Case(name, expect))


@pytest.mark.timeout(60)
def test_run_directory_file_as_a_user_runs_it(tmp_path: Path) -> None:
    (tmp_path / "runs").write_text("x")
    path = tmp_path / "whale.toml"
    path.write_text("[run]\ndirectory = 'runs'\n")
    proc = subprocess.run(
        [sys.executable, "-m", "whale_lab", "--config", str(path), "eval", "--limit", "1"],
        capture_output=True, text=True, timeout=50, cwd=tmp_path,
    )
    _check_one_line(proc.returncode, proc.stdout, proc.stderr, Case("dir", "run.directory"))


# ------------------------------------------------------------------ checks that need torch


@pytest.fixture()
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real torch module with its CUDA/MPS answers replaced: a machine of our choosing."""
    torch = pytest.importorskip("torch")

    def machine(cuda: str | None, devices: int, mps: bool = False) -> None:
        monkeypatch.setattr(torch.version, "cuda", cuda)
        monkeypatch.setattr(torch.version, "hip", None, raising=False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: devices > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
        monkeypatch.setattr(torch.backends.mps, "is_built", lambda: mps)
        monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)

    return machine


def test_device_checked_against_the_machine(fake_torch: Any) -> None:
    from whale_lab.devices import resolve_device

    fake_torch(None, 0)  # a CPU-only build
    assert resolve_device("cpu") == "cpu" and resolve_device("auto") == "cpu"
    for spec in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match=rf"model.device: '{spec}' needs a CUDA build"):
            resolve_device(spec)
    with pytest.raises(ConfigError, match="built without MPS"):
        resolve_device("mps")
    fake_torch("12.4", 0)  # a CUDA build on a machine without a GPU
    with pytest.raises(ConfigError, match="no CUDA device is visible"):
        resolve_device("cuda")
    fake_torch("12.4", 2)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(ConfigError) as err:
        resolve_device("cuda:99")
    assert str(err.value) == "model.device: 'cuda:99' but this machine has 2 CUDA device(s) (cuda:0 to cuda:1)"
    fake_torch(None, 0, mps=True)
    assert resolve_device("auto") == "mps" and resolve_device("mps") == "mps"


@pytest.mark.timeout(60)
def test_hf_backend_checks_the_device_before_loading(fake_torch: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import whale_lab.models as models
    from whale_lab.backends.hf import HFBackend

    def no_load(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the model was loaded before the device was checked")

    monkeypatch.setattr(models, "load_model_and_tokenizer", no_load)
    fake_torch("12.4", 1)
    with pytest.raises(ConfigError, match=r"'cuda:3' but this machine has 1 CUDA device\(s\) \(cuda:0\)"):
        HFBackend.from_config(load_config(None, ['model.device="cuda:3"']))


def test_lora_targets_checked_against_the_model() -> None:
    torch = pytest.importorskip("torch")
    from whale_lab.weights.lora import WeightsError, attach, check_target_modules

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(4, 4)
            self.v_proj = torch.nn.Linear(4, 4)
            self.norm = torch.nn.LayerNorm(4)

    model = torch.nn.Sequential(*[Block() for _ in range(2)])
    check_target_modules(model, ("q_proj", "v_proj", "0.q_proj"))  # a dotted tail matches too
    for targets in (("no_such_proj",), ("q_proj", "norm"), ()):
        with pytest.raises(WeightsError) as err:
            check_target_modules(model, targets)
        text = str(err.value)
        assert "\n" not in text and "model.lora.target_modules" in text
        assert "its linear layers are named: q_proj, v_proj" in text
    cfg = load_config(None, ['model.lora.target_modules=["no_such_proj"]'])
    with pytest.raises(WeightsError, match=r"\['no_such_proj'\] not found in the model"):
        attach(model, None, cfg)
