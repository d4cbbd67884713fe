"""Session-wide test setup: a private model cache, the tiny random model, one `transformers serve`.

`WHALE_LAB_CACHE` points at a session temp folder (or at an existing `/tmp/wlcache`-style folder
when the variable is already set, so repeated local runs reuse the built model). Tests marked `gpu`
are skipped when CUDA is absent. Torch runs single-threaded (OMP_NUM_THREADS=1 unless set).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from servers import TransformersServer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import servers` from any test

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # no "Writing model shards" bars
# Tiny models run fastest on one thread; on a busy 2-core machine two torch threads that spin-wait
# on each other make generation 10-30x slower. Read by torch when it is first imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

_CALLER_CACHE = os.environ.get("WHALE_LAB_CACHE")
_SERVER: dict[str, object] = {}  # the session's `transformers serve`, once launched


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped without it")
    # whale-lab refuses to run untrusted code where the OS cannot confine it. On such a machine
    # the suite still tests everything else: the engine tests run unconfined (as a user would with
    # sandbox.allow_unconfined), and the confinement tests skip, naming the reason.
    from whale_lab import confine

    conf = confine.detect()
    if not conf.confined:
        os.environ.setdefault(confine.ALLOW_ENV, "1")


def pytest_report_header(config: pytest.Config) -> str:
    from whale_lab import confine

    return f"whale-lab sandbox: {confine.detect().describe()}"


def _tiny_model_dir() -> Path:
    from whale_lab.models import build_tiny_random, cache_dir

    return build_tiny_random(cache_dir() / "tiny-random")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Launch `transformers serve` early when a selected test needs it (start-up overlaps tests)
    and skip `gpu` tests without CUDA."""
    if any("transformers_server" in getattr(item, "fixturenames", ()) for item in items):
        _use_session_cache()
        from servers import TransformersServer

        _SERVER["server"] = TransformersServer(_tiny_model_dir()).launch()
    _skip_gpu_tests(items)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    server = _SERVER.pop("server", None)
    if server is not None:
        server.stop()  # type: ignore[attr-defined]


def _skip_gpu_tests(items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def _use_session_cache() -> Path:
    """WHALE_LAB_CACHE for this session: the caller's folder, else a fresh temp folder."""
    path = Path(os.environ.get("WHALE_LAB_CACHE") or tempfile.mkdtemp(prefix="wlcache-"))
    path.mkdir(parents=True, exist_ok=True)
    os.environ["WHALE_LAB_CACHE"] = str(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def whale_lab_cache() -> Iterator[Path]:
    """Point WHALE_LAB_CACHE at a folder for the whole session (kept if the caller chose one)."""
    path = _use_session_cache()
    yield path
    if _CALLER_CACHE is None:
        os.environ.pop("WHALE_LAB_CACHE", None)
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir(whale_lab_cache: Path) -> Path:
    """The tiny random Llama-style model folder (built once per cache, offline)."""
    return _tiny_model_dir()


@pytest.fixture(scope="session")
def lively_model_dir(tiny_model_dir: Path, whale_lab_cache: Path) -> Path:
    """The tiny model with wider random weights (`servers.spread_weights`), saved as a folder:
    its greedy output depends on the prompt."""
    folder = whale_lab_cache / "tiny-random-lively"
    if (folder / "config.json").exists():
        return folder
    from servers import spread_weights

    from whale_lab.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_dir))
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    spread_weights(model).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, folder)
    return folder


@pytest.fixture(scope="session")
def transformers_server(tiny_model_dir: Path) -> Iterator[TransformersServer]:
    """`transformers serve` (unpinned) with the tiny model loaded; one per session, launched at
    collection time. Requests name a model by its folder path (`server.model`)."""
    from servers import TransformersServer

    server = _SERVER.get("server")
    if not isinstance(server, TransformersServer):
        server = _SERVER["server"] = TransformersServer(tiny_model_dir).launch()
    try:
        server.wait_ready()
    except RuntimeError as exc:
        pytest.fail(f"could not start `transformers serve`: {exc}")
    yield server
    server.stop()
