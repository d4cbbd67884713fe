"""Model presets and loading: every model, shipped or built locally, loads with `from_pretrained`.

Presets resolve to folders on disk; nothing on the default path downloads. A hub id still works for
users who have a hub, through the same `from_pretrained` call.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from whale_lab.backends.base import BackendError

PACKAGE_DIR = Path(__file__).resolve().parent
MICRO_DIR = PACKAGE_DIR / "micro" / "model"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>"]


def cache_dir() -> Path:
    base = os.environ.get("WHALE_LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "whale-lab"
    )
    p = Path(base)
    p.mkdir(parents=True, exist_ok=True)
    return p


def resolve_model_path(name: str) -> str:
    """Preset name -> local folder (building it if it is built locally); other names pass through."""
    if name == "micro":
        if (MICRO_DIR / "config.json").exists():
            return str(MICRO_DIR)
        # Until the shipped micro model exists, the tiny random model stands in.
        return str(build_tiny_random(cache_dir() / "tiny-random"))
    if name == "tiny-random":
        return str(build_tiny_random(cache_dir() / "tiny-random"))
    if name == "smollm2-135m":
        from whale_lab.micro.smollm2 import smollm2_folder

        return str(smollm2_folder())
    p = Path(name).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise BackendError(f"model folder {p} has no config.json: not a transformers model folder")
        return str(p)
    if name.startswith((".", "/", "~")) or os.sep in name and name.count("/") != 1:
        raise BackendError(f"model path {name!r} does not exist")
    return name  # a hub id: from_pretrained will try it (and fail clearly offline)


def train_byte_bpe_tokenizer(texts: list[str], vocab_size: int = 512) -> Any:
    """A byte-level BPE tokenizer trained here, wrapped as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|end|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def _default_tokenizer_corpus() -> list[str]:
    words = (
        "the answer is search python move board question passage result error format "
        "<answer> </answer> <search> </search> <python> </python> <move> </move> \\boxed{} "
        "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) a b c d e f g h 1 2 3 4 5 6 7 8 legal moves FEN "
        "Solve the problem. Use the tool. Reply with one move in UCI. system user assistant"
    )
    return [words] * 50


def build_tiny_random(folder: str | Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A tiny Llama-style model with random weights and a locally trained tokenizer (for tests)."""
    folder = Path(folder)
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    tokenizer = train_byte_bpe_tokenizer(_default_tokenizer_corpus(), vocab_size=384)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "whale_lab.json").write_text(json.dumps({"kind": "tiny-random", "seed": seed}))
    try:
        os.replace(tmp, folder)
    except OSError:  # another process won the race; use theirs
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_model_and_tokenizer(name: str, *, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer from a preset, folder or hub id; clear errors otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name)
    torch_dtype = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16,
                   "float16": torch.float16}[dtype]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except Exception as exc:  # OSError, SafetensorError, ValueError from a damaged or foreign folder
        raise BackendError(f"model.path {name!r}: cannot load the model from {path}: {exc}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    model.to(device)
    model.eval()
    return model, tokenizer
