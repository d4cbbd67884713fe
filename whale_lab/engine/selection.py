"""Selection without peeking: the checkpoint best on val, with its test score beside it.

The best-on-test figure (the paper's way of reporting) is computed for comparison only and never
chooses anything. It is taken over the evaluation points that have a test score: every point
under `eval.test_every = "always"`, only the new bests on val under `"best"` (the default); the
note beside it says over how many. Two points tied on val are told apart by the later one's
paired val score against the earlier (`report.select_on_val`); `decided_by` says which rule chose.
"""

from __future__ import annotations

from typing import Any

from whale_lab.engine.runbook import RunBook
from whale_lab.store import atomic_write_json, read_json

RESULT_FILE = "result.json"
SELECTION_RULE = "the checkpoint (weights + harness) best on val; test reported at that point"
PAPER_RULE = "best on test, the paper's way: for comparison only, never for selection"


def checkpoint_info(book: RunBook, key: str) -> dict[str, Any]:
    """Harness and weights of an evaluation point (engine's or the weight phase's)."""
    if not key:
        return {}
    info = book.state.checkpoints.get(book.rel(key))
    if info:
        return {"harness": info.get("harness", ""), "weights": info.get("weights", "")}
    meta = read_json(book.abs(key) / "meta.json", None)  # a weight-phase checkpoint
    if isinstance(meta, dict):
        return {"harness": book.rel(meta.get("harness", "")), "weights": book.rel(key)}
    return {}


def best(book: RunBook) -> dict[str, Any]:
    """Val-selected checkpoint with its test score, and the best-on-test figure beside it."""
    from whale_lab.engine.report import summarise_run

    s = summarise_run(book.root)
    if not s.curve:
        return {}
    tested = [p for p in s.curve if p.test is not None]
    on_test = max(tested, key=lambda p: (p.test, -p.rollouts)) if tested else None
    info = checkpoint_info(book, s.selected_checkpoint)
    return {
        "checkpoint": book.rel(s.selected_checkpoint) if s.selected_checkpoint else "",
        "val": s.selected_val,
        "test": s.selected_test,
        "harness": info.get("harness", ""),
        "weights": info.get("weights", ""),
        "best_on_test": s.best_test,
        "best_on_test_checkpoint": book.rel(on_test.checkpoint) if on_test else "",
        "selection": SELECTION_RULE,
        "decided_by": s.selection_rule,
        "best_on_test_note": f"{PAPER_RULE}; over the {len(tested)} of {len(s.curve)} "
        "evaluation points scored on test",
    }


def write_result(
    book: RunBook, status: str, message: str, *, schedule: str, domain: str, seed: int
) -> dict[str, Any]:
    """Record the run's outcome in state.json and result.json; returns the selection."""
    chosen = best(book)
    book.state.status = status
    book.state.message = message
    book.state.best = chosen
    book.save()
    atomic_write_json(
        book.root / RESULT_FILE,
        {
            "status": status,
            "message": message,
            "best": chosen,
            "ledger": book.state.ledger,
            "schedule": schedule,
            "domain": domain,
            "seed": seed,
        },
    )
    return chosen
