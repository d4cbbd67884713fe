"""torch's thread count: chosen from the free cores, never past the affinity, explicit wins."""

from __future__ import annotations

import math
import os
import sys
import types

import pytest

from whale_lab import threads
from whale_lab.threads import ENV, choose_threads


@pytest.mark.parametrize(
    ("cores", "load", "want"),
    [
        (2, 1.34, 1),  # a busy 2-core machine: one thread, not two fighting for one free core
        (2, 0.2, 2),
        (2, 0.0, 2),
        (8, 3.0, 5),
        (8, 3.6, 4),  # a core less than half free does not count
        (4, 10.0, 1),  # overloaded: still one thread
        (4, None, 4),  # no load average on this platform
        (4, -1.0, 4),
        (4, math.nan, 4),
        (1, 0.0, 1),
    ],
)
def test_the_count_is_the_free_cores_within_the_affinity(
    cores: int, load: float | None, want: int
) -> None:
    choice = choose_threads(cores, load, {})
    assert choice.threads == want and choice.chosen and choice.source == "free cores"
    assert 1 <= choice.threads <= cores
    assert f"torch threads: {want}" in choice.describe() and ENV in choice.describe()


def test_an_explicit_omp_num_threads_is_kept_as_given() -> None:
    choice = choose_threads(2, 1.9, {ENV: "3"})
    assert (choice.threads, choice.source, choice.chosen) == (3, ENV, False)
    assert f"{ENV}=3" in choice.describe()
    odd = choose_threads(2, 0.0, {ENV: "many"})
    assert (odd.threads, odd.source, odd.chosen) == (None, ENV, False)
    assert choose_threads(2, 0.0, {ENV: "  "}).chosen  # blank is unset


def test_a_torch_already_told_otherwise_is_kept() -> None:
    told = choose_threads(4, 0.0, {}, torch_threads=1)
    assert (told.threads, told.source, told.chosen) == (1, "torch", False)
    # torch at its default (one thread per allowed core) is not a choice anyone made
    default = choose_threads(4, 2.0, {}, torch_threads=4)
    assert (default.threads, default.chosen) == (2, True)


class _FakeTorch(types.ModuleType):
    def __init__(self, threads: int) -> None:
        super().__init__("torch")
        self.threads = threads

    def get_num_threads(self) -> int:
        return self.threads

    def set_num_threads(self, n: int) -> None:
        self.threads = n


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has chosen nothing yet, with no OMP_NUM_THREADS (restored afterwards)."""
    monkeypatch.setattr(threads, "_choice", None)
    monkeypatch.setattr(threads, "_told", set())
    monkeypatch.setenv(ENV, "unset-by-the-fixture")
    monkeypatch.delenv(ENV)
    monkeypatch.setattr(threads, "allowed_cores", lambda: 2)
    monkeypatch.setattr(threads, "load_average", lambda: 1.5)


def test_configure_applies_once_and_tells_once(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    heard: list[str] = []
    first = threads.configure(heard.append)
    assert first.threads == 1 and os.environ[ENV] == "1"  # read by torch when it is imported
    monkeypatch.setattr(threads, "load_average", lambda: 0.0)  # the load changes: no new choice
    again = threads.configure(heard.append)
    assert again is first and heard == [first.describe()]


def test_configure_sets_a_loaded_torch_at_its_default(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = _FakeTorch(2)
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert threads.configure().threads == 1 and torch.threads == 1


def test_configure_leaves_an_explicit_setting_alone(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = _FakeTorch(2)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setenv(ENV, "2")
    choice = threads.configure()
    assert (choice.threads, choice.source) == (2, ENV) and torch.threads == 2
    assert os.environ[ENV] == "2"
