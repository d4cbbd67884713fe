"""Nothing computed from the reference answers reaches the files a proposer reads.

`retrieval_recall` and `answer_in_results` (search) are derived from the gold answers: a
proposer that saw them could tune a harness towards the references. They stay in the engine's
in-memory diagnostics (probes, eval summaries) and are stripped from the phase archive, with the
one list of private keys that also scrubs traces (`trace.PRIVATE_INFO_KEYS`).
"""

from __future__ import annotations

from pathlib import Path

from test_search_phase import H0_PATH, _phase, backend, make_cfg  # noqa: F401 - fixture

from whale_lab import metrics
from whale_lab.search.archive import PhaseArchive
from whale_lab.search.scoring import write_scores
from whale_lab.trace import PRIVATE_INFO_KEYS, EpisodeTrace

# the keys the search domain computes from the references (a subset of the private list)
REFERENCE_DERIVED = ("retrieval_recall", "answer_in_results")


def _search_traces() -> list[EpisodeTrace]:
    return [
        EpisodeTrace(
            task_id=f"t{i}",
            domain="search",
            sample=0,
            harness="h0",
            reward=float(i % 2),
            stop_reason="answered",
            tool_calls=1,
            info={"retrieval_recall": i < 2, "answer_in_results": i < 2, "em": bool(i % 2)},
        )
        for i in range(4)
    ]


class _Report:
    """The fields `write_scores` reads, from real traces and the real diagnostics."""

    def __init__(self, traces: list[EpisodeTrace]) -> None:
        self.traces = traces
        self.success_rate = metrics.success_rate(traces)
        self.mean_at_k = metrics.mean_at_k(traces)
        self.pass_at_k = metrics.pass_at_k(traces)
        self.mean_turns = 0.0
        self.tokens = 0
        self.rollouts = len(traces)
        self.k = 1
        self.n_tasks = len(traces)
        self.seconds = 0.1
        self.diagnostics = metrics.diagnostics(traces)


def test_private_keys_list_covers_the_reference_derived_ones() -> None:
    assert set(REFERENCE_DERIVED) <= PRIVATE_INFO_KEYS


def test_scores_json_keeps_diagnostics_but_not_reference_derived_ones(tmp_path: Path) -> None:
    traces = _search_traces()
    report = _Report(traces)
    # engine-side: the recall is computed and kept
    assert report.diagnostics["retrieval_recall"] == 0.5
    archive = PhaseArchive(tmp_path)
    cid = archive.add_candidate(
        H0_PATH.read_text(), parent_id="", hypothesis="x", surface="", proposer="i", iteration=1
    )
    write_scores(archive, cid, report)
    written = archive.read(cid, "scores")
    assert written["diagnostics"]["episodes"] == 4.0  # the other diagnostics stay
    assert written["diagnostics"]["accuracy_when_answered"] == 0.5
    assert not set(written["diagnostics"]) & PRIVATE_INFO_KEYS
    text = (archive.folder(cid) / "scores.json").read_text()
    assert not any(key in text for key in REFERENCE_DERIVED)
    # the caller's report is not altered: the engine's diagnostics still carry the recall
    assert "retrieval_recall" in report.diagnostics


def test_search_phase_archive_holds_no_reference_derived_key(tmp_path: Path, backend) -> None:  # noqa: F811
    cfg = make_cfg(
        tmp_path, harness_search={"candidates_per_iteration": 2, "acceptance": "paired"}
    )
    phase = _phase(cfg, backend, tmp_path / "run")
    try:
        phase.run(H0_PATH, iterations=1)
    finally:
        phase.store.close()
    root = tmp_path / "run"
    scores = list(root.rglob("scores.json"))
    assert scores, "the phase scored nothing"
    files = [p for p in root.rglob("*") if p.is_file() and "harness_phases" in p.parts]
    assert files
    hits = [
        (str(p.relative_to(root)), key)
        for p in files
        for key in REFERENCE_DERIVED
        if key in p.read_text(encoding="utf-8", errors="replace")
    ]
    assert not hits, hits
