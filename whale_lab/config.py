"""Configuration: frozen dataclasses read from TOML with strict validation.

Every mistake in a config is a user's mistake, so it becomes a `ConfigError` with one line that names
the key path, what was expected and, for a typo, the closest valid key. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from whale_lab.errors import WhaleLabError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(WhaleLabError, ValueError):
    """A config problem, phrased for the user: key path, expectation, hint."""


def _range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> dict:
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


def _f(default: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
       doc: str = "") -> Any:
    """A field with an optional numeric range checked at load time."""
    meta = {"range": _range(lo, hi, lo_open=lo_open), "doc": doc}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for list defaults")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunConfig:
    name: str = "default"
    seed: int = _f(0, 0)
    directory: str = "runs"


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = True
    rank: int = _f(8, 1, 1024)
    alpha: float = _f(16.0, 0.0, lo_open=True)
    dropout: float = _f(0.0, 0.0, 1.0)
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True)
class ModelConfig:
    # A preset name ("micro", "tiny-random", "smollm2-135m"), a local folder, or a hub id.
    path: str = "micro"
    backend: Literal["hf", "openai", "vllm"] = "hf"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    max_context_tokens: int = _f(2048, 64)
    # openai backend only
    base_url: str = "http://127.0.0.1:8000/v1"
    served_model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    request_timeout_s: float = _f(120.0, 0.0, lo_open=True)
    max_retries: int = _f(3, 0, 20)
    concurrency: int = _f(16, 1, 1024)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass(frozen=True)
class SplitSizes:
    weight: int = _f(512, 1)
    harness: int = _f(32, 1)
    val: int = _f(32, 1)
    test: int = _f(32, 1)


@dataclass(frozen=True)
class DomainConfig:
    name: Literal["math", "search", "chess"] = "math"
    # "builtin" for the generated data; otherwise a path to a user's file (format by domain).
    source: str = "builtin"
    # search only: a user's passages (JSONL) and an optional Search-R1 retrieval server URL.
    corpus: str = ""
    retriever_url: str = ""
    splits: SplitSizes = field(default_factory=SplitSizes)
    # Harness file used when none is given; empty means harnesses/<domain>/h0.py.
    harness: str = ""


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = _f(1.0, 0.0)
    top_p: float = _f(1.0, 0.0, 1.0, lo_open=True)
    top_k: int = _f(20, 0)
    max_new_tokens: int = _f(96, 1)
    k: int = _f(8, 1, 1024)
    batch_size: int = _f(64, 1)


@dataclass(frozen=True)
class SandboxConfig:
    call_timeout_s: float = _f(2.0, 0.0, lo_open=True)
    memory_mb: int = _f(1024, 64)
    cpu_seconds: int = _f(600, 1)
    max_output_chars: int = _f(20000, 100)


@dataclass(frozen=True)
class RsftConfig:
    prompts_per_step: int = _f(8, 1)
    samples_per_prompt: int = _f(8, 1)
    accept_threshold: float = _f(0.5, 0.0, 1.0)
    minibatch_size: int = _f(16, 1)
    learning_rate: float = _f(1e-3, 0.0, lo_open=True)
    weight_decay: float = _f(0.0, 0.0)
    max_grad_norm: float = _f(1.0, 0.0, lo_open=True)
    full_finetune: bool = False
    eval_every: float = _f(0.25, 0.0, lo_open=True, doc="fraction of an epoch of the weight split")
    epochs: float = _f(1.0, 0.0, lo_open=True)


@dataclass(frozen=True)
class HarnessSearchConfig:
    candidates_per_iteration: int = _f(3, 1, 16)
    iterations: int = _f(6, 1)
    rollouts_per_task: int = _f(1, 1)
    smoke_tasks: int = _f(4, 1)
    prompt_only: bool = False
    min_gain: float = _f(0.0, 0.0, 1.0)  # a new harness must beat the incoming one by this much


@dataclass(frozen=True)
class ProposerConfig:
    kind: Literal["rules", "llm", "manual", "claude-code"] = "rules"
    base_url: str = "http://127.0.0.1:8001/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    max_tool_calls: int = _f(40, 1)
    max_tokens: int = _f(200000, 1)
    max_seconds: float = _f(600.0, 0.0, lo_open=True)
    request_timeout_s: float = _f(120.0, 0.0, lo_open=True)
    max_retries: int = _f(3, 0, 20)
    price_per_million_input: float = _f(0.0, 0.0)
    price_per_million_output: float = _f(0.0, 0.0)


@dataclass(frozen=True)
class ScheduleConfig:
    kind: Literal["whale", "adaptive", "weight-only", "harness-only", "stagewise", "prompt-only"] = "whale"
    cycles: int = _f(2, 1)
    weight_epochs: float = _f(0.6, 0.0, lo_open=True)
    harness_iterations: int = _f(6, 1)
    # adaptive schedule
    window_epochs: float = _f(0.2, 0.0, lo_open=True)
    patience_epochs: float = _f(0.2, 0.0, lo_open=True)
    min_weight_epochs: float = _f(0.2, 0.0)
    harness_patience: int = _f(2, 1)
    min_harness_iterations: int = _f(6, 1)
    max_harness_iterations: int = _f(15, 1)
    # total budgets for the single-component schedules
    total_weight_epochs: float = _f(1.2, 0.0, lo_open=True)
    total_harness_iterations: int = _f(12, 1)


@dataclass(frozen=True)
class ApprovalConfig:
    mode: Literal["manual", "auto", "threshold"] = "manual"
    threshold: float = _f(0.0, 0.0, 1.0, doc="smoke success rate needed in threshold mode")
    headless_mode: Literal["manual", "auto", "threshold"] = "auto"


@dataclass(frozen=True)
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    domain: DomainConfig = field(default_factory=DomainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rsft: RsftConfig = field(default_factory=RsftConfig)
    harness_search: HarnessSearchConfig = field(default_factory=HarnessSearchConfig)
    proposer: ProposerConfig = field(default_factory=ProposerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    approval: ApprovalConfig = field(default_factory=ApprovalConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)

    def replace(self, **sections: Any) -> Config:
        return dataclasses.replace(self, **sections)


# ---------------------------------------------------------------- loading


def _to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: _to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [_to_dict(x) for x in obj]
    return obj


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple,):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, str(tp)
    )


def _convert(value: Any, tp: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for alt in get_args(tp):
            if alt is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(value, alt, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{path}: unexpected value {value!r}")
    if origin is Literal:
        options = get_args(tp)
        if value not in options:
            close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {value!r}{hint}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {type(value).__name__}")
        (item_tp, *_rest) = get_args(tp)
        return tuple(_convert(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a table, got {type(value).__name__}")
        return _build(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported type {tp}")  # pragma: no cover


def _check_range(value: Any, meta: dict, path: str) -> None:
    rng = meta.get("range")
    if not rng or not isinstance(value, (int, float)):
        return
    lo, hi, lo_open = rng["lo"], rng["hi"], rng["lo_open"]
    if lo is not None and (value < lo or (lo_open and value == lo)):
        op = ">" if lo_open else ">="
        raise ConfigError(f"{path}: expected a value {op} {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"{path}: expected a value <= {hi}, got {value!r}")


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields_by_name = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{key}" if path else key
        if key not in fields_by_name:
            close = difflib.get_close_matches(key, list(fields_by_name), n=1)
            hint = f" (did you mean {(path + '.' if path else '') + close[0]!r}?)" if close else ""
            valid = ", ".join(fields_by_name)
            raise ConfigError(f"{key_path}: unknown key{hint}; valid keys here: {valid}")
        value = _convert(value, hints[key], key_path)
        _check_range(value, dict(fields_by_name[key].metadata), key_path)
        kwargs[key] = value
    return cls(**kwargs)


def _parse_scalar(text: str) -> Any:
    """Read an override's value as TOML, falling back to a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b=value` overrides to a raw TOML dict (validation happens afterwards)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE")
        key, raw = item.split("=", 1)
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError(f"--set {item!r}: empty key")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {part} is not a table")
        node[parts[-1]] = _parse_scalar(raw.strip())
    return data


OLD_SANDBOX_NOTE = (
    "harness_search.sandbox is deprecated: move the table to the top level as [sandbox] "
    "(read from the old place this time)"
)


def migrate_config(data: dict) -> list[str]:
    """Move keys from their old places to their new ones in a raw config dict; returns notes.

    `[harness_search.sandbox]` became `[sandbox]` (it confines every untrusted process, not only
    harness search); both at once is an error, since one would be silently ignored.
    """
    notes: list[str] = []
    hs = data.get("harness_search")
    if isinstance(hs, dict) and "sandbox" in hs:
        old = hs.pop("sandbox")
        if "sandbox" in data:
            raise ConfigError(
                "harness_search.sandbox: set in both [harness_search.sandbox] and [sandbox]; "
                "keep only [sandbox]"
            )
        data["sandbox"] = old
        notes.append(OLD_SANDBOX_NOTE)
    return notes


def config_from_dict(data: dict) -> Config:
    """A config from a raw dict (a run's config.json may still use the old key places)."""
    data = dict(data)
    if isinstance(data.get("harness_search"), dict):
        data["harness_search"] = dict(data["harness_search"])
    migrate_config(data)
    return _build(Config, data, "")


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read `whale.toml` (or defaults when path is None) and apply `--set` overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: config file not found")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    data = apply_overrides(data, list(overrides or []))
    for note in migrate_config(data):
        print(f"whale-lab: note: {note}", file=sys.stderr)
    return config_from_dict(data)


def find_default_config() -> Path | None:
    """`whale.toml` in the working directory, else the one beside the package checkout."""
    here = Path.cwd() / "whale.toml"
    if here.exists():
        return here
    beside = Path(__file__).resolve().parent.parent / "whale.toml"
    return beside if beside.exists() else None
