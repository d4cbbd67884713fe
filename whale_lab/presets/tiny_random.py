"""The `tiny-random` preset: a tiny Llama with random weights and a tokenizer trained here.

It builds in seconds on a CPU with no download, which is what tests and the micro fallback need.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from whale_lab.presets.common import CHAT_TEMPLATE, SPECIAL_TOKENS, cache_dir

FOLDER_NAME = "tiny-random"


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


def tiny_random_folder() -> Path:
    """The cached tiny-random folder, built on first use."""
    return build_tiny_random(cache_dir() / FOLDER_NAME)
