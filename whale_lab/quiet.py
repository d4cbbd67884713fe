"""Keep libraries from writing to the terminal: progress bars and warnings would tear a TUI apart.

`quiet_libraries()` sets the environment variables the libraries read when they are imported
(transformers, huggingface_hub, tokenizers, tqdm, vLLM) and, for those already imported, switches
their loggers and progress bars off directly. It imports nothing heavy and may be called repeatedly.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

ENV = {
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_HUB_DISABLE_IMPLICIT_TOKEN": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TQDM_DISABLE": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_CONFIGURE_LOGGING": "0",
    "PYTHONWARNINGS": "ignore",
}
LOGGERS = (
    "transformers",
    "huggingface_hub",
    "peft",
    "accelerate",
    "torch",
    "vllm",
    "httpx",
    "httpcore",
    "urllib3",
    "filelock",
    "datasets",
)
WARNING_MODULES = r"(transformers|huggingface_hub|peft|accelerate|torch|tokenizers|vllm|tqdm)(\.|$)"


def quiet_libraries(level: int = logging.ERROR) -> None:
    """Silence progress bars, advisory warnings and chatty loggers of the ML libraries."""
    for key, value in ENV.items():
        os.environ.setdefault(key, value)
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(max(logger.level, level))
    warnings.filterwarnings("ignore", module=WARNING_MODULES)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if "transformers" in sys.modules:
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity(level)
            hf_logging.disable_progress_bar()
        except Exception:  # an unusual transformers build: the env vars still apply
            pass
    if "huggingface_hub" in sys.modules:
        try:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        except Exception:
            pass
    if "datasets" in sys.modules:
        try:
            import datasets

            datasets.disable_progress_bars()
        except Exception:
            pass


# The name used where a short verb reads better.
silence = quiet_libraries
