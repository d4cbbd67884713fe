"""What RSFT trains: LoRA adapters attached in place through peft, or every weight.

Attaching in place matters: for the `hf` backend the module that generates the next rollouts is
the very module trained here, so there is no copy that could go stale. peft injects its LoRA
layers into the given model object, and `TrainableModel.base` stays that object.
"""

from __future__ import annotations

import json
import sys
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from whale_lab.config import Config
from whale_lab.errors import WhaleLabError


class WeightsError(WhaleLabError, RuntimeError):
    """A problem with model or adapter weights that a user can fix (path, shape, config)."""


ADAPTER_FILES = ("adapter_config.json",)


@dataclass
class TrainableModel:
    """The module trained by RSFT and the facts needed to save, load and serve its weights."""

    model: Any  # the module whose forward computes the training loss (a PeftModel for LoRA)
    base: Any  # the transformers model; the `hf` backend generates with this very object
    tokenizer: Any
    lora: bool
    adapted: tuple[str, ...] = ()  # full names of the modules LoRA wraps (empty: full FT)

    def named_trainable(self) -> Iterator[tuple[str, Any]]:
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                yield name, p

    def parameters(self) -> list[Any]:
        return [p for _, p in self.named_trainable()]

    @property
    def device(self) -> Any:
        return next(iter(self.model.parameters())).device

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        """Generation mode: dropout off (LoRA dropout included)."""
        self.model.eval()

    def save_pretrained(self, folder: str | Path) -> Path:
        """A folder others can use: a peft adapter (for LoRA) or a full transformers model."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder))
        if not self.lora:
            self.tokenizer.save_pretrained(str(folder))
        return folder


def _linear_modules(model: Any) -> list[str]:
    """Full names of the layers LoRA can wrap: torch Linear, and transformers' Conv1D (GPT-2)."""
    import torch

    return [
        name
        for name, mod in model.named_modules()
        if name and (isinstance(mod, torch.nn.Linear) or type(mod).__name__ == "Conv1D")
    ]


def _linear_module_names(model: Any) -> list[str]:
    return sorted({name.rsplit(".", 1)[-1] for name in _linear_modules(model)})


ALL_LINEAR = "all-linear"


def _output_head_names(model: Any) -> set[str]:
    """The output projection's module name(s): peft's "all-linear" leaves the LM head alone."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return {name for name, mod in model.named_modules() if head is not None and mod is head}


def resolve_target_modules(model: Any, targets: tuple[str, ...] | str) -> tuple[str, ...]:
    """The layer names LoRA will wrap: the configured names (each checked against the model), or
    for "all-linear" every linear layer's name but the output head's, as peft resolves it."""
    if targets == ALL_LINEAR or tuple(targets) == (ALL_LINEAR,):
        heads = _output_head_names(model)
        names = sorted(
            {n.rsplit(".", 1)[-1] for n in _linear_modules(model) if n not in heads}
            - {h.rsplit(".", 1)[-1] for h in heads}
        )
        if not names:
            raise WeightsError(
                "model.lora.target_modules = 'all-linear': the model has no linear layers "
                "besides its output head, so LoRA would adapt nothing"
            )
        return tuple(names)
    check_target_modules(model, tuple(targets))
    return tuple(targets)


def adapted_summary(tm: TrainableModel) -> str:
    """One line on what LoRA adapts: how many modules, under which names."""
    names = sorted({n.rsplit(".", 1)[-1] for n in tm.adapted})
    return f"LoRA adapts {len(tm.adapted)} modules named {', '.join(names)}"


_SHOWN_NAMES = 8  # a 70B model has hundreds of layers; a few real names are enough to fix a typo


def check_target_modules(model: Any, targets: tuple[str, ...] | list[str]) -> None:
    """Every `model.lora.target_modules` entry names a linear layer of `model`, as peft matches
    it (the last part of the name, or a dotted tail such as `self_attn.q_proj`), checked as the
    model loads; otherwise a one-line WeightsError listing a few real names."""
    full = _linear_modules(model)
    names = _linear_module_names(model)
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in full)]
    if not missing and targets:
        return
    shown = ", ".join(names[:_SHOWN_NAMES])
    more = f" and {len(names) - _SHOWN_NAMES} more" if len(names) > _SHOWN_NAMES else ""
    raise WeightsError(
        f"model.lora.target_modules: {missing or '[]'} not found in the model; "
        f"its linear layers are named: {shown or '(none)'}{more}"
    )


# Models already prepared for training, so that a second phase on the same backend reuses the
# adapter instead of stacking another one on top.
_ATTACHED: weakref.WeakKeyDictionary[Any, TrainableModel] = weakref.WeakKeyDictionary()


def attach(model: Any, tokenizer: Any, cfg: Config) -> TrainableModel:
    """LoRA from `cfg.model.lora` (default), or full fine-tuning when `rsft.full_finetune`."""
    full = cfg.rsft.full_finetune or not cfg.model.lora.enabled
    known = _ATTACHED.get(model)
    if known is not None:
        if known.lora == full:
            raise WeightsError(
                "this model is already being trained "
                + (
                    "with LoRA; full fine-tuning cannot be switched on now"
                    if known.lora
                    else "in full; LoRA cannot be attached now"
                )
            )
        return known
    peft = sys.modules.get("peft")  # a model cannot be a PeftModel unless peft is loaded
    if peft is not None and isinstance(model, peft.PeftModel):
        if full:
            raise WeightsError(
                "the model already carries a peft adapter: full fine-tuning needs a plain model"
            )
        for name, p in model.named_parameters():  # train the adapter it came with
            p.requires_grad_("lora_" in name)
        tm = TrainableModel(model=model, base=model, tokenizer=tokenizer, lora=True)
        _ATTACHED[model] = tm
        return tm
    if full:
        for p in model.parameters():
            p.requires_grad_(True)
        tm = TrainableModel(model=model, base=model, tokenizer=tokenizer, lora=False)
        _ATTACHED[model] = tm
        return tm
    lc = cfg.model.lora
    targets = resolve_target_modules(model, lc.target_modules)  # before peft: a typo fails fast
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    config = LoraConfig(
        r=lc.rank,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=list(targets),
        bias="none",
        task_type="CAUSAL_LM",
    )
    import torch

    device = next(iter(model.parameters())).device
    rng_devices = [device] if device.type == "cuda" else []
    try:
        # LoRA's A matrices are random: draw them from run.seed so a run is reproducible.
        with warnings.catch_warnings(), torch.random.fork_rng(devices=rng_devices):
            warnings.simplefilter("ignore", FutureWarning)  # peft calls deprecated helpers
            torch.manual_seed(cfg.run.seed)
            peft_model = get_peft_model(model, config)
    except ValueError as exc:
        raise WeightsError(f"cannot attach LoRA to the model: {exc}") from None
    model.eval()
    adapted = tuple(n for n, mod in peft_model.named_modules() if hasattr(mod, "lora_A"))
    if not adapted:
        raise WeightsError(f"model.lora.target_modules {list(targets)}: peft adapted no module")
    tm = TrainableModel(
        model=peft_model, base=model, tokenizer=tokenizer, lora=True, adapted=adapted
    )
    _ATTACHED[model] = tm
    return tm


def read_adapter_config(folder: str | Path) -> dict[str, Any]:
    """The adapter's config, or a WeightsError that says what is wrong with the folder."""
    folder = Path(folder).expanduser()
    if not folder.exists():
        raise WeightsError(f"adapter folder {folder} does not exist")
    if not folder.is_dir():
        raise WeightsError(f"adapter path {folder} is not a folder")
    cfg_path = folder / "adapter_config.json"
    if not cfg_path.exists():
        raise WeightsError(
            f"adapter folder {folder} has no adapter_config.json: not a peft adapter"
        )
    try:
        data = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WeightsError(f"{cfg_path}: not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{cfg_path}: expected a JSON object")
    if not any((folder / n).exists() for n in ("adapter_model.safetensors", "adapter_model.bin")):
        raise WeightsError(f"adapter folder {folder} has no adapter_model.safetensors")
    return data


def load_adapter_weights(tm: TrainableModel, folder: str | Path) -> None:
    """Load a saved peft adapter into the attached one (same rank and target modules)."""
    if not tm.lora:
        raise WeightsError(
            "an adapter can only be loaded when training LoRA (rsft.full_finetune is on)"
        )
    folder = Path(folder).expanduser()
    data = read_adapter_config(folder)
    own = tm.model.peft_config[tm.model.active_adapter]
    if int(data.get("r", -1)) != own.r:
        raise WeightsError(
            f"adapter {folder} has rank {data.get('r')}, but model.lora.rank is {own.r}"
        )
    theirs = sorted(data.get("target_modules") or [])
    if theirs != sorted(own.target_modules):
        raise WeightsError(
            f"adapter {folder} targets {theirs}, but model.lora.target_modules is "
            f"{sorted(own.target_modules)}"
        )
    from peft import set_peft_model_state_dict
    from peft.utils import load_peft_weights

    try:
        weights = load_peft_weights(str(folder), device=str(tm.device))
    except Exception as exc:  # noqa: BLE001 - corrupt or truncated files: say so plainly
        raise WeightsError(f"cannot read adapter weights in {folder}: {exc}") from None
    try:
        result = set_peft_model_state_dict(tm.model, weights)
    except RuntimeError as exc:
        raise WeightsError(f"adapter {folder} does not fit this model: {exc}") from None
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise WeightsError(
            f"adapter {folder} has weights this model lacks (e.g. {unexpected[0]}): "
            "it was trained for a different base model"
        )
    lora_missing = [k for k in getattr(result, "missing_keys", []) or [] if "lora_" in k]
    if not weights or lora_missing:
        raise WeightsError(
            f"adapter {folder} lacks weights for this model's LoRA layers"
            + (f" (e.g. {lora_missing[0]})" if lora_missing else "")
        )
