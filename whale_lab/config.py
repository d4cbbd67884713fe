"""Configuration: frozen dataclasses read from TOML with strict validation.

Every mistake in a config is a user's mistake, so it becomes a `ConfigError` with one line that names
the key path, what was expected and, for a typo, the closest valid key. Nothing here imports torch.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import math
import re
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


# Upper bounds: a value past them is a typo or an attack, and would otherwise overflow a timer, an
# rlimit or a generator far from the config (a traceback, or a hang with no output).
INT64_MAX = 2**63 - 1
MAX_SPLIT_SIZE = 10_000_000
MAX_TOKENS = 10_000_000
MAX_COUNT = 1_000_000
MAX_ITERATIONS = 100_000
MAX_EPOCHS = 10_000.0
DAY_S = 86_400.0
WEEK_S = 604_800.0
# What `model.device` may name; whether this machine has it is checked when a model is placed.
DEVICE_PATTERN = r"auto|cpu|mps|cuda(:(0|[1-9][0-9]{0,3}))?"
DEVICE_FORMS = "auto, cpu, cuda, cuda:N or mps"
_SHOW_CHARS = 60


def _show(value: Any) -> str:
    """A value for a one-line message: its repr, cut short (a 1 MB string stays readable)."""
    text = repr(value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 3] + "..."


def _key_text(key: str) -> str:
    """A key as written in a path; an odd one (newline, dot, space) is quoted so paths stay one line."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _show(key)


def _range(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False) -> dict:
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


def _f(default: Any, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
       doc: str = "", pattern: str = "", expect: str = "", folder: bool = False) -> Any:
    """A field with an optional numeric range (or text pattern, or folder path) checked at load."""
    meta = {"range": _range(lo, hi, lo_open=lo_open), "doc": doc, "pattern": pattern,
            "expect": expect, "folder": folder}
    if isinstance(default, (list, dict)):
        raise TypeError("use tuples for list defaults")
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunConfig:
    name: str = "default"
    seed: int = _f(0, 0, INT64_MAX)
    directory: str = _f("runs", folder=True)


@dataclass(frozen=True)
class LoraConfig:
    enabled: bool = True
    rank: int = _f(8, 1, 1024)
    alpha: float = _f(16.0, 0.0, 1e6, lo_open=True)
    dropout: float = _f(0.0, 0.0, 1.0)
    # Layer names (as peft matches them), or "all-linear": every linear layer but the output head,
    # so a model with other projection names (linear-attention layers) is adapted everywhere.
    target_modules: tuple[str, ...] | Literal["all-linear"] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
    )


@dataclass(frozen=True)
class VllmConfig:
    """In-process vLLM (`model.backend = "vllm"`); a `vllm serve` takes these as its own flags."""

    gpu_memory_utilization: float = _f(0.85, 0.0, 1.0, lo_open=True)
    # Sleep (level 1: weights to CPU, KV cache freed) during the SFT pass, wake after.
    enable_sleep_mode: bool = False
    tensor_parallel_size: int = _f(1, 1, 1024)
    enforce_eager: bool = False  # no CUDA graphs: slower decoding, faster start, less memory


@dataclass(frozen=True)
class HfConfig:
    """The in-process transformers backend (`model.backend = "hf"`): how it schedules decoding."""

    # A row leaves the batch as it ends and a waiting prompt takes its slot; false: each chunk of
    # sampling.batch_size runs to its longest row (one model.generate per chunk).
    continuous: bool = True
    # Free slots that let waiting prompts join at once (one prefill each time); 0: a quarter of
    # sampling.batch_size.
    refill: int = _f(0, 0, MAX_COUNT)
    # MiB for finished rows' keys/values, kept so an episode's next turn prefills only its new
    # tokens (least recently used go first; emptied when the weights change); 0 keeps none.
    prefix_cache_mb: int = _f(1024, 0, 1_048_576)


@dataclass(frozen=True)
class ModelConfig:
    # A preset name ("micro", "tiny-random", "smollm2-135m"), a local folder, or a hub id.
    path: str = "micro"
    backend: Literal["hf", "openai", "vllm"] = "hf"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    device: str = _f("cpu", pattern=DEVICE_PATTERN, expect=DEVICE_FORMS)
    max_context_tokens: int = _f(2048, 64, MAX_TOKENS)
    # openai backend only; a list names independent endpoints serving the same model
    base_url: str | tuple[str, ...] = "http://127.0.0.1:8000/v1"
    served_model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    request_timeout_s: float = _f(120.0, 0.0, DAY_S, lo_open=True)
    max_retries: int = _f(3, 0, 20)
    concurrency: int = _f(16, 1, 1024)
    lora: LoraConfig = field(default_factory=LoraConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    hf: HfConfig = field(default_factory=HfConfig)


@dataclass(frozen=True)
class SplitSizes:
    weight: int = _f(512, 1, MAX_SPLIT_SIZE)
    harness: int = _f(32, 1, MAX_SPLIT_SIZE)
    val: int = _f(32, 1, MAX_SPLIT_SIZE)
    test: int = _f(32, 1, MAX_SPLIT_SIZE)


@dataclass(frozen=True)
class JudgeConfig:
    """search only: an LLM judge over an OpenAI-compatible endpoint decides the reward; exact
    match is the fallback when the judge fails and is recorded beside its verdict."""

    enabled: bool = False
    base_url: str = "http://127.0.0.1:8002/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    rules: str = ""  # a text file with the judge's rules; empty: the shipped rules
    request_timeout_s: float = _f(60.0, 0.0, DAY_S, lo_open=True)
    max_retries: int = _f(2, 0, 20)
    max_tokens: int = _f(16, 1, 100_000)  # the judge's reply: one word is enough


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
    # Seed that draws the tasks and their splits; -1 = run.seed. A comparison fixes it across
    # seeds (the seed then varies sampling and training only), so arms are paired on one task set.
    split_seed: int = _f(-1, -1, INT64_MAX)
    judge: JudgeConfig = field(default_factory=JudgeConfig)


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = _f(1.0, 0.0, 100.0)
    top_p: float = _f(1.0, 0.0, 1.0, lo_open=True)
    top_k: int = _f(20, 0, MAX_COUNT)
    max_new_tokens: int = _f(96, 1, MAX_TOKENS)
    k: int = _f(8, 1, 1024)
    batch_size: int = _f(64, 1, MAX_COUNT)
    # Share of a scoring wave whose episodes may end in backend errors before scoring stops.
    max_invalid_share: float = _f(0.05, 0.0, 1.0)
    # Extra variables for the chat template, on every backend (e.g. enable_thinking = false).
    chat_template_kwargs: dict[str, bool | int | float | str] = field(default_factory=dict)


@dataclass(frozen=True)
class SandboxConfig:
    call_timeout_s: float = _f(2.0, 0.0, DAY_S, lo_open=True)
    memory_mb: int = _f(1024, 64, 1_048_576)
    cpu_seconds: int = _f(600, 1, int(WEEK_S))
    max_output_chars: int = _f(20000, 100, 100_000_000)
    # Where bwrap cannot confine untrusted code (no user namespaces, not Linux) whale-lab refuses
    # to run it; true runs it with resource limits only, with a warning on every run that is
    # also recorded in the run (WHALE_LAB_ALLOW_UNCONFINED=1 does the same).
    allow_unconfined: bool = False


@dataclass(frozen=True)
class RsftConfig:
    prompts_per_step: int = _f(8, 1, MAX_COUNT)
    samples_per_prompt: int = _f(8, 1, 1024)
    accept_threshold: float = _f(0.5, 0.0, 1.0)
    minibatch_size: int = _f(16, 1, MAX_COUNT)
    learning_rate: float = _f(1e-3, 0.0, 10.0, lo_open=True)
    weight_decay: float = _f(0.0, 0.0, 10.0)
    max_grad_norm: float = _f(1.0, 0.0, 1e6, lo_open=True)
    full_finetune: bool = False
    # Recompute activations in the backward pass: less memory for long replies, ~30% more time.
    gradient_checkpointing: bool = False
    # What minibatch_size counts: "examples" (one per accepted model turn) or "trajectories"
    # (every turn of that many accepted rollouts, as the paper's minibatch of 64).
    minibatch_unit: Literal["examples", "trajectories"] = "examples"
    # "single": the SFT pass runs in this process; "accelerate": in `processes` data-parallel
    # processes (DDP for LoRA, FSDP for full fine-tuning on CUDA; DDP over gloo on a CPU).
    launcher: Literal["single", "accelerate"] = "single"
    processes: int = _f(2, 1, 1024)
    # Half an epoch keeps evaluation under a quarter of a default cycle's time (with test only at
    # new bests on val), measured with benchmarks/cycle_split.py.
    eval_every: float = _f(0.5, 0.0, MAX_EPOCHS, lo_open=True, doc="fraction of an epoch of the weight split")
    epochs: float = _f(1.0, 0.0, MAX_EPOCHS, lo_open=True)


@dataclass(frozen=True)
class EvalConfig:
    # "best": an evaluation point scores test only when its val mean@k is a new best of the run
    # (the val-selected checkpoint always has its test score, and the other points cost val
    # alone); "always": every point scores test too, for the paper-style best-on-test figure
    # over every checkpoint.
    test_every: Literal["best", "always"] = "best"


@dataclass(frozen=True)
class HarnessSearchConfig:
    candidates_per_iteration: int = _f(3, 1, 16)
    iterations: int = _f(6, 1, MAX_ITERATIONS)
    rollouts_per_task: int = _f(1, 1, 1024)
    smoke_tasks: int = _f(4, 1, MAX_SPLIT_SIZE)
    prompt_only: bool = False
    min_gain: float = _f(0.0, 0.0, 1.0)  # a new harness must beat the incoming one by this much
    # "paired": accept the best candidate only when the lower bound of its paired difference
    # against the incoming harness (same tasks, same seeds) is above min_gain; "best": the
    # paper's rule (the best success rate wins), for reproductions.
    acceptance: Literal["paired", "best"] = "paired"


@dataclass(frozen=True)
class ProposerConfig:
    kind: Literal["rules", "llm", "manual", "claude-code"] = "rules"
    base_url: str = "http://127.0.0.1:8001/v1"
    model: str = ""
    api_key_env: str = "OPENAI_API_KEY"
    max_tool_calls: int = _f(40, 1, MAX_COUNT)
    max_tokens: int = _f(200000, 1, 10**12)
    max_seconds: float = _f(600.0, 0.0, WEEK_S, lo_open=True)
    request_timeout_s: float = _f(120.0, 0.0, DAY_S, lo_open=True)
    max_retries: int = _f(3, 0, 20)
    price_per_million_input: float = _f(0.0, 0.0, 1e6)
    price_per_million_output: float = _f(0.0, 0.0, 1e6)
    # Sent as `max_tokens` in every request (`max_tokens` above is the whole session's budget).
    request_max_tokens: int = _f(2048, 1, 1_000_000)
    # Requests in flight at the endpoint, timed-out ones still winding down included.
    concurrency: int = _f(1, 1, 64)
    # A phase archive or run folder whose recorded proposer sessions are replayed (no requests).
    replay: str = ""


@dataclass(frozen=True)
class ScheduleConfig:
    kind: Literal[
        "whale", "adaptive", "weight-only", "harness-only", "stagewise", "prompt-only", "best-of-n"
    ] = "whale"
    cycles: int = _f(2, 1, MAX_ITERATIONS)
    weight_epochs: float = _f(0.6, 0.0, MAX_EPOCHS, lo_open=True)
    # whale / prompt-only: the first weight phase's budget in epochs (short, so the app's first
    # review comes within minutes on a CPU); 0 = weight_epochs, the paper's equal phases
    first_weight_epochs: float = _f(0.1, 0.0, MAX_EPOCHS)
    harness_iterations: int = _f(6, 1, MAX_ITERATIONS)
    # adaptive schedule
    window_epochs: float = _f(0.2, 0.0, MAX_EPOCHS, lo_open=True)
    patience_epochs: float = _f(0.2, 0.0, MAX_EPOCHS, lo_open=True)
    min_weight_epochs: float = _f(0.2, 0.0, MAX_EPOCHS)
    # adaptive: a cap on one weight phase, in epochs; 0 = none (phases share the total budget)
    max_phase_weight_epochs: float = _f(0.0, 0.0, MAX_EPOCHS)
    harness_patience: int = _f(2, 1, MAX_ITERATIONS)
    min_harness_iterations: int = _f(6, 1, MAX_ITERATIONS)
    max_harness_iterations: int = _f(15, 1, MAX_ITERATIONS)
    # total budgets for the single-component schedules
    total_weight_epochs: float = _f(1.2, 0.0, MAX_EPOCHS, lo_open=True)
    total_harness_iterations: int = _f(12, 1, MAX_ITERATIONS)


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
    eval: EvalConfig = field(default_factory=EvalConfig)
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
    if isinstance(obj, dict):
        return dict(obj)
    return obj


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (tuple,):
        return f"a list of {_type_name(get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp) or origin is dict:
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
            raise ConfigError(f"{path}: expected {_type_name(tp)}, got {_show(value)}{hint}")
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
    if origin is dict:  # a free table of scalars (chat template variables)
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a table, got {type(value).__name__}")
        _key_tp, value_tp = get_args(tp)
        out = {}
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                raise ConfigError(
                    f"{path}.{_key_text(key)}: expected true/false, a number or a string, "
                    f"got {type(item).__name__}"
                )
            out[key] = _convert(item, value_tp, f"{path}.{_key_text(key)}")
        return out
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {_show(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer past the float range
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{path}: expected a finite number, got {_show(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {_show(value)}")
        return value
    raise ConfigError(f"{path}: unsupported type {tp}")  # pragma: no cover


def _check_range(value: Any, meta: dict, path: str) -> None:
    rng = meta.get("range")
    if not rng or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    lo, hi, lo_open = rng["lo"], rng["hi"], rng["lo_open"]
    if isinstance(value, int):  # every integer fits int64 (seeds, counts and sizes reach C code)
        lo = -INT64_MAX - 1 if lo is None else lo
        hi = INT64_MAX if hi is None else hi
    if lo is not None and (value < lo or (lo_open and value == lo)):
        op = ">" if lo_open else ">="
        raise ConfigError(f"{path}: expected a value {op} {lo}, got {_show(value)}")
    if hi is not None and value > hi:
        raise ConfigError(f"{path}: expected a value <= {hi}, got {_show(value)}")


def _check_text(value: Any, meta: dict, path: str) -> None:
    """A string field with a fixed form (`model.device`), checked without importing torch."""
    pattern = meta.get("pattern")
    if not pattern or not isinstance(value, str) or re.fullmatch(pattern, value):
        return
    words = [w for w in re.split(r"[ ,]+", meta.get("expect", "")) if w.isalpha() and w != "or"]
    close = difflib.get_close_matches(value.lower(), words, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ConfigError(f"{path}: expected {meta.get('expect') or pattern}, got {_show(value)}{hint}")


def _check_folder(value: Any, meta: dict, path: str) -> None:
    """A folder the run writes into: refuse a path that is a file, or lies below one."""
    if not meta.get("folder") or not isinstance(value, str):
        return
    if "\x00" in value:
        raise ConfigError(f"{path}: {_show(value)} contains a NUL character; expected a folder path")
    try:
        target = Path(value).expanduser()
    except RuntimeError:  # "~someone" with no such user
        raise ConfigError(f"{path}: {value!r}: no such user's home folder") from None
    for p in (target, *target.parents):
        try:
            if p.is_dir():
                return
            if p.exists():
                where = "is a file" if p == target else f"lies below {p}, which is a file"
                raise ConfigError(f"{path}: {value!r} {where}; expected a folder to write runs into")
        except OSError as exc:  # a name too long, a permission problem: say which
            raise ConfigError(f"{path}: {value!r} cannot be used as a folder ({exc.strerror})") from None


def _build(cls: type, data: dict, path: str) -> Any:
    hints = typing.get_type_hints(cls)
    fields_by_name = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        key_path = f"{path}.{_key_text(key)}" if path else _key_text(key)
        if key not in fields_by_name:
            close = difflib.get_close_matches(key, list(fields_by_name), n=1)
            hint = f" (did you mean {(path + '.' if path else '') + close[0]!r}?)" if close else ""
            valid = ", ".join(fields_by_name)
            raise ConfigError(f"{key_path}: unknown key{hint}; valid keys here: {valid}")
        value = _convert(value, hints[key], key_path)
        meta = dict(fields_by_name[key].metadata)
        _check_range(value, meta, key_path)
        _check_text(value, meta, key_path)
        _check_folder(value, meta, key_path)
        kwargs[key] = value
    return cls(**kwargs)


def _toml(text: str, where: str) -> dict:
    """tomllib.loads with every failure as one line: a syntax error, or nesting so deep that the
    recursive parser would overflow the stack (5,000 nested arrays)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid TOML: arrays or tables nested too deeply") from None


def _parse_scalar(text: str) -> Any:
    """Read an override's value as TOML, falling back to a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    except RecursionError:
        raise ConfigError("arrays or tables nested too deeply") from None


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
        try:
            node[parts[-1]] = _parse_scalar(raw.strip())
        except ConfigError as exc:
            raise ConfigError(f"--set {_show(key.strip())}: {exc}") from None
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


def _read_utf8(p: Path) -> str:
    """The file's text as UTF-8 (a byte-order mark is allowed); a ConfigError naming the first
    bad byte otherwise, and for a folder or an unreadable file."""
    if p.is_dir():
        raise ConfigError(f"{p}: is a folder, expected a TOML config file")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror})") from None
    skip = len(codecs.BOM_UTF8) if raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        offset = skip + exc.start
        line = raw[:offset].count(b"\n") + 1
        raise ConfigError(
            f"{p}: not UTF-8 text: byte 0x{raw[offset]:02x} at offset {offset} (line {line}); "
            f"save the config as UTF-8"
        ) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read `whale.toml` (or defaults when path is None) and apply `--set` overrides."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"{p}: config file not found")
        data = _toml(_read_utf8(p), str(p))
    data = apply_overrides(data, list(overrides or []))
    notes = migrate_config(data)
    cfg = config_from_dict(data)  # first: a config error stays the one line printed
    for note in notes:
        print(f"whale-lab: note: {note}", file=sys.stderr)
    return cfg


def find_default_config() -> Path | None:
    """`whale.toml` in the working directory, else the one beside the package checkout."""
    here = Path.cwd() / "whale.toml"
    if here.exists():
        return here
    beside = Path(__file__).resolve().parent.parent / "whale.toml"
    return beside if beside.exists() else None


def split_seed(cfg: Config) -> int:
    """The seed the domain draws its tasks and splits with: `domain.split_seed`, else `run.seed`."""
    return cfg.domain.split_seed if cfg.domain.split_seed >= 0 else cfg.run.seed
