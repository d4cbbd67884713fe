"""The harness phase end to end on the tiny random model and the real search domain.

Approval modes (auto, threshold, manual with reject / edit / pin / pending across a restart),
acceptance ties, candidates that crash or hang while scored, prompt-only violations, an LLM
proposer session replayed over HTTP, and the `whale-lab search` command with resume.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.openai_replay_server import ReplayServer, fault, say, tool_call

from whale_lab.commands.search import run_search
from whale_lab.config import Config, config_from_dict
from whale_lab.context import RunContext
from whale_lab.domains import make_domain
from whale_lab.events import (
    CandidateProposed,
    CandidateScored,
    EpisodeFinished,
    HarnessAccepted,
    Log,
    ProposerUsage,
    ReviewDecided,
    ReviewRequested,
)
from whale_lab.reviewers import TerminalReviewer
from whale_lab.seams import ReviewDecision, ReviewItem
from whale_lab.search.meta_harness import HarnessPhase, PhaseStatus
from whale_lab.search.proposers.llm import LLMProposer
from whale_lab.search.proposers.manual import ManualProposer
from whale_lab.store import read_jsonl

REPO = Path(__file__).resolve().parent.parent
H0_PATH = REPO / "harnesses" / "search" / "h0.py"
H0 = H0_PATH.read_text(encoding="utf-8")
CANDIDATE_FILES = (
    "harness.py",
    "meta.json",
    "diff.patch",
    "hypothesis.md",
    "validation.json",
    "smoke.json",
    "smoke_traces.jsonl",
    "scores.json",
    "traces.jsonl",
    "status.json",
    "decision.json",
)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_cfg(tmp_path: Path, **over: Any) -> Config:
    data = {
        "run": {"directory": str(tmp_path / "runs"), "seed": 0},
        "model": {"path": "tiny-random"},
        "domain": {"name": "search", "splits": {"weight": 4, "harness": 3, "val": 2, "test": 2}},
        "sampling": {"max_new_tokens": 4, "k": 1},
        "harness_search": {
            "candidates_per_iteration": 2,
            "iterations": 2,
            "smoke_tasks": 1,
            "sandbox": {"call_timeout_s": 0.5},
            # these tests pin the mechanics of the paper's rule; paired acceptance has its own
            "acceptance": "best",
        },
        "approval": {"mode": "auto"},
    }
    return config_from_dict(_merge(data, over))


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path):
    from whale_lab.backends import make_backend

    b = make_backend(config_from_dict({"model": {"path": str(tiny_model_dir)}}))
    yield b
    b.close()


class ScriptedReviewer:
    """A Reviewer that answers from a list, recording what it was shown."""

    def __init__(self, decisions: list[ReviewDecision | Any]) -> None:
        self.decisions = list(decisions)
        self.seen: list[ReviewItem] = []

    def review(self, item: ReviewItem) -> ReviewDecision:
        self.seen.append(item)
        d = self.decisions.pop(0) if self.decisions else ReviewDecision("approve")
        return d(item) if callable(d) else d


def _phase(cfg: Config, backend, store, reviewer=None, **kw) -> HarnessPhase:
    from whale_lab.store import RunStore

    store = store if isinstance(store, RunStore) else RunStore(store)
    return HarnessPhase(RunContext.of(cfg, backend, make_domain(cfg), store), reviewer, **kw)


def _events(store_root: Path) -> list[dict]:
    return list(read_jsonl(store_root / "events.jsonl"))


def _of(events: list[dict], cls) -> list[dict]:
    return [e for e in events if e["type"] == cls.type]


# ---------------------------------------------------------------- auto mode, archive contents


def test_auto_phase_with_rules_proposer(tmp_path: Path, backend) -> None:
    cfg = make_cfg(tmp_path)
    phase = _phase(cfg, backend, tmp_path / "run")
    result = phase.run(H0_PATH, iterations=2)
    archive = phase.archive
    assert result.status == "completed" and result.reason == "budget"
    ids = archive.ids()
    assert ids == ["c000", "c001", "c002"]
    assert result.harness_rollouts == 3 + 2 * (1 + 3)
    assert result.accepted_id in ids and archive.status(result.accepted_id) == "accepted"
    for cid in ids[1:]:
        folder = archive.folder(cid)
        assert all((folder / f).is_file() for f in CANDIDATE_FILES), cid
        meta = archive.meta(cid)
        assert meta["proposer"] == "rules" and meta["iteration"] == 2 and meta["mechanism"]
        assert archive.read(cid, "decision")["by"] == "auto"
        assert len(list(archive.traces(cid))) == 3
    summary = json.loads((archive.root / "summary.json").read_text())
    assert [r["id"] for r in summary["candidates"]] == ids
    assert (archive.root / "frontier.json").is_file() and (archive.root / "summary.md").is_file()

    events = _events(phase.store.root)
    assert len(_of(events, CandidateProposed)) == 3 and len(_of(events, CandidateScored)) == 3
    assert len(_of(events, ReviewRequested)) == 2 and len(_of(events, ReviewDecided)) == 2
    assert len(_of(events, HarnessAccepted)) == 1 and len(_of(events, ProposerUsage)) == 1
    ep = _of(events, EpisodeFinished)[0]
    line = list(read_jsonl(phase.store.root / ep["trace_path"]))[ep["trace_line"]]
    assert line["task_id"] == ep["task_id"]
    ledger = list(read_jsonl(phase.store.root / "proposer_ledger.jsonl"))
    assert ledger[0]["kind"] == "proposer" and ledger[0]["candidates"] == ["c001", "c002"]

    # The test split, the verifier and the reference answers never reach the archive.
    domain = make_domain(cfg)
    text = "\n".join(p.read_text(encoding="utf-8") for p in archive.root.rglob("*") if p.is_file())
    for task in domain.tasks("test"):
        assert task.id not in text and task.fields["question"] not in text
    for cid in ids:
        for tr in archive.traces(cid):
            assert not {"answer", "gold", "reference"} & set(tr["info"])
    phase.store.close()


def test_threshold_mode_rejects_below_the_bar(tmp_path: Path, backend) -> None:
    cfg = make_cfg(
        tmp_path,
        approval={"mode": "threshold", "threshold": 0.5},
        harness_search={"candidates_per_iteration": 1},
    )
    phase = _phase(cfg, backend, tmp_path / "run")
    result = phase.run(H0_PATH, iterations=2)
    c1 = phase.archive.record("c001")
    assert c1.status == "rejected" and c1.decision["by"] == "threshold"
    assert "below threshold 50%" in c1.decision["reason"]
    assert not (c1.folder / "scores.json").exists()
    assert result.accepted_id == "c000" and result.harness_rollouts == 3 + 1


# ---------------------------------------------------------------- manual mode across a restart


def test_manual_pending_restart_reject_edit_pin(tmp_path: Path, backend) -> None:
    cfg = make_cfg(tmp_path, approval={"mode": "manual"})
    run = tmp_path / "run"
    first = ScriptedReviewer([ReviewDecision("pending", reason="later")])
    phase = _phase(cfg, backend, run, first)
    result = phase.run(H0_PATH, iterations=3)
    assert result.status == "pending" and result.pending == ("c001",)
    assert phase.archive.status("c001") == "awaiting_review"
    assert phase.archive.status("c002") == "proposed"
    phase.store.close()

    def edit(item: ReviewItem) -> ReviewDecision:
        code = item.code.replace("MAX_TURNS = 2", "MAX_TURNS = 1") + "\n# edited by a human\n"
        return ReviewDecision("edit", reason="one turn is enough", edited_code=code)

    second = ScriptedReviewer(
        [
            ReviewDecision("reject", reason="too verbose; no prompt changes please"),
            edit,
            ReviewDecision("pin", reason="I prefer this one"),
        ]
    )
    phase = _phase(cfg, backend, run, second)  # a fresh process would build exactly this
    result = phase.run(H0_PATH, iterations=3)
    archive = phase.archive
    assert [i.candidate_id for i in second.seen][:3] == ["c001", "c002", "c003"]
    assert result.status == "completed"
    c1, c2 = archive.record("c001"), archive.record("c002")
    assert c1.status == "rejected" and "too verbose" in c1.decision["reason"]
    assert c2.decision["decision"] == "edit" and c2.decision["edited"] is True
    assert (c2.folder / "harness.proposed.py").is_file()
    assert "# edited by a human" in archive.code("c002") and "+# edited by a human" in archive.diff(
        "c002"
    )
    assert c2.scores["rollouts"] == 3
    # the rejection reason is part of what the proposer read next
    c3 = archive.record("c003")
    assert c3.iteration == 3 and "too verbose" in c3.hypothesis
    assert all(r.surface != "prompts" for r in archive.records() if r.iteration == 3)
    assert result.accepted_id == "c003" and result.pinned
    assert archive.pinned() == "c003"
    events = _events(phase.store.root)
    accepted = _of(events, HarnessAccepted)[-1]
    assert accepted["candidate_id"] == "c003" and accepted["pinned"] is True
    requested = [e["candidate_id"] for e in _of(events, ReviewRequested)]
    assert requested.count("c001") == 2  # asked again after the restart
    phase.store.close()


# ---------------------------------------------------------------- ties, crashes and hangs


def _drop(inbox: Path, name: str, code: str, hypothesis: str) -> None:
    inbox.mkdir(parents=True, exist_ok=True)
    (inbox / f"{name}.py").write_text(code, encoding="utf-8")
    (inbox / f"{name}.md").write_text(hypothesis, encoding="utf-8")


def test_ties_crash_and_hang_during_scoring(tmp_path: Path, backend) -> None:
    cfg = make_cfg(
        tmp_path, harness_search={"candidates_per_iteration": 3}, proposer={"kind": "manual"}
    )
    domain = make_domain(cfg)
    first_q = domain.tasks("harness")[0].fields["question"]
    guard = (
        "\n\ndef select_context(messages, **context):\n"
        "    text = ' '.join(str(m.get('content', '')) for m in messages)\n"
        f"    if {first_q!r} not in text:\n"
        "        {action}\n"
        "    return messages\n"
    )
    phase = _phase(cfg, backend, tmp_path / "run", proposer=ManualProposer(editor=""))
    inbox = phase.archive.inbox
    _drop(
        inbox,
        "a_fewer_turns",
        H0.replace("MAX_TURNS = 2", "MAX_TURNS = 1"),
        "One turn: same success, fewer turns.",
    )
    _drop(
        inbox,
        "b_hangs",
        H0 + guard.replace("{action}", "while True:\n            pass"),
        "Hangs on most tasks.",
    )
    _drop(
        inbox,
        "c_raises",
        H0 + guard.replace("{action}", "raise RuntimeError('boom')"),
        "Raises on most tasks.",
    )
    result = phase.run(H0_PATH, iterations=2)
    archive = phase.archive
    a, b, c = (archive.record(x) for x in ("c001", "c002", "c003"))
    assert a.proposer == "manual" and a.hypothesis == "One turn: same success, fewer turns."
    assert b.smoke["rollouts"] == 1 and b.validation["ok"] is True  # the smoke run passed
    assert b.status == "crashed" and "harness error" in b.status_reason
    assert c.status == "crashed" and "boom" in c.status_reason
    assert b.scores["stop_reasons"]["harness_error"] == 2
    c0 = archive.record("c000")
    assert a.success_rate == c0.success_rate == 0.0 and a.mean_turns < c0.mean_turns
    assert result.accepted_id == "c001"  # the tie goes to fewer mean turns
    scored = {
        e["candidate_id"]: e["status"] for e in _of(_events(phase.store.root), CandidateScored)
    }
    assert scored == {
        "c000": "evaluated",
        "c001": "evaluated",
        "c002": "crashed",
        "c003": "crashed",
    }
    assert not list(inbox.glob("*.py"))
    phase.store.close()


def test_prompt_only_violation_is_invalid_with_reason(tmp_path: Path, backend) -> None:
    cfg = make_cfg(tmp_path, harness_search={"prompt_only": True}, proposer={"kind": "manual"})
    phase = _phase(cfg, backend, tmp_path / "run", proposer=ManualProposer(editor=""))
    _drop(
        phase.archive.inbox, "a_turns", H0.replace("MAX_TURNS = 2", "MAX_TURNS = 3"), "More turns."
    )
    _drop(
        phase.archive.inbox,
        "b_prompt",
        H0.replace("Answer the question.", "Answer the question in two words."),
        "Shorter answers.",
    )
    phase.run(H0_PATH, iterations=2)
    bad, good = phase.archive.record("c001"), phase.archive.record("c002")
    assert bad.status == "invalid" and bad.validation["stage"] == "prompt_only"
    line = next(i for i, ln in enumerate(H0.splitlines(), 1) if ln.startswith("MAX_TURNS ="))
    assert f"`MAX_TURNS` (line {line}) differs" in bad.status_reason
    assert good.status in ("evaluated", "accepted") and good.surface == "prompts"
    assert "prompt-only mode" in (phase.archive.root / "summary.md").read_text()
    phase.store.close()


# ---------------------------------------------------------------- the LLM proposer in a phase


def test_llm_proposer_in_the_phase_and_a_failed_session(tmp_path: Path, backend) -> None:
    code = H0.replace("Answer the question.", "Answer the question with a name.")
    script = [
        say(tool_call("read_file", {"path": "summary.md"})),
        say(tool_call("grep", {"pattern": "format_failure", "path": "candidates/c000"})),
        say(
            tool_call(
                "write_candidate",
                {"code": code, "hypothesis": "names only", "parent": "c000", "surface": "prompts"},
            )
        ),
        fault("500"),
        fault("500"),
        fault("500"),
    ]
    with ReplayServer(script) as server:
        cfg = make_cfg(
            tmp_path,
            harness_search={"candidates_per_iteration": 1},
            proposer={
                "kind": "llm",
                "base_url": server.base_url,
                "model": "m",
                "max_retries": 2,
                "price_per_million_input": 1.0,
            },
        )
        phase = _phase(
            cfg, backend, tmp_path / "run", proposer=LLMProposer(cfg.proposer, backoff_s=0.01)
        )
        stops: list[PhaseStatus] = []
        result = phase.run(H0_PATH, iterations=3, stop_when=lambda s: stops.append(s) or False)
    assert result.status == "completed" and phase.archive.ids() == ["c000", "c001"]
    assert phase.archive.record("c001").proposer == "llm"
    assert "| c000 |" in server.requests[1]["messages"][-1]["content"]
    ledger = list(read_jsonl(phase.store.root / "proposer_ledger.jsonl"))
    assert [x["iteration"] for x in ledger] == [2, 3]
    assert ledger[0]["prompt_tokens"] == 300 and ledger[0]["cost"] == pytest.approx(300 / 1e6)
    assert "HTTP 500" in ledger[1]["error"] and ledger[1]["candidates"] == []
    logs = [e["message"] for e in _of(_events(phase.store.root), Log)]
    assert any("iteration 3) failed" in m for m in logs)
    assert [s.iteration for s in stops] == [1, 2]
    assert result.proposer_usage["prompt_tokens"] == 300
    phase.store.close()


def test_stop_when_ends_the_phase_early(tmp_path: Path, backend) -> None:
    cfg = make_cfg(tmp_path, harness_search={"candidates_per_iteration": 1})
    phase = _phase(cfg, backend, tmp_path / "run")
    result = phase.run(H0_PATH, iterations=5, stop_when=lambda s: s.iteration >= 2)
    assert result.reason == "patience" and result.iterations_done == 2
    assert result.accepted_id is not None and len(result.history) == 2
    phase.store.close()


# ---------------------------------------------------------------- the command


def test_run_search_command_pending_then_resume(tmp_path: Path, backend) -> None:
    cfg = make_cfg(
        tmp_path, approval={"mode": "manual"}, harness_search={"candidates_per_iteration": 1}
    )
    out = io.StringIO()
    code = run_search(
        cfg, reviewer=ScriptedReviewer([ReviewDecision("pending")]), backend=backend, out=out
    )
    assert code == 3 and "awaits review; resume with: whale-lab search --resume" in out.getvalue()
    run_dir = next((tmp_path / "runs").iterdir())
    assert json.loads((run_dir / "search.json").read_text())["iterations"] == 2
    out = io.StringIO()
    code = run_search(
        cfg,
        run_dir=str(run_dir),
        resume=True,
        backend=backend,
        out=out,
        reviewer=ScriptedReviewer([ReviewDecision("approve")]),
    )
    text = out.getvalue()
    assert code == 0, text
    assert "c001 approve by human" in text and "accepted c00" in text and "summary:" in text
    assert (run_dir / "harness_phases" / "cycle-01" / "summary.md").is_file()


def test_terminal_reviewer_reads_decisions() -> None:
    item = ReviewItem(
        candidate_id="c004",
        diff="--- a\n+++ b\n@@ -1 +1 @@\n-x\n+y\n",
        hypothesis="Parse [bold]answers[/bold].",
        surface="parser",
        code="y\n",
        smoke_success=0.25,
    )
    out = io.StringIO()
    d = TerminalReviewer(stdin=io.StringIO("what\nr\n\ntoo broad\n"), stdout=out).review(item)
    assert d.decision == "reject" and d.reason == "too broad"
    text = out.getvalue()
    assert "review c004" in text and "[bold]answers[/bold]" in text and "+y" in text
    assert "please answer" in text
    assert TerminalReviewer(stdin=io.StringIO("a\n"), stdout=out).review(item).decision == "approve"
    assert TerminalReviewer(stdin=io.StringIO(""), stdout=out).review(item).decision == "pending"
    assert TerminalReviewer(stdin=io.StringIO("p\n"), stdout=out).review(item).decision == "pin"


def test_paired_acceptance_measures_the_noise_floor_and_says_what_it_supports(
    tmp_path: Path, backend
) -> None:
    cfg = make_cfg(tmp_path, harness_search={"acceptance": "paired"})
    phase = _phase(cfg, backend, tmp_path / "run")
    result = phase.run(H0_PATH, iterations=2)
    archive = phase.archive
    # the incoming harness scored twice: 3 tasks more, and the noise floor recorded
    assert result.harness_rollouts == 3 + 3 + 2 * (1 + 3)
    floor = archive.read("c000", "noise_floor")
    assert floor["n_tasks"] == 3 and floor["rollouts_per_task"] == 1 and floor["note"]
    assert "paired" in floor["method"]
    assert phase.state["noise_floor"] == floor
    assert (archive.folder("c000") / "traces_repeat.jsonl").is_file()
    # 3 tasks never support a paired verdict: the incoming harness stays
    assert result.accepted_id == "c000"
    logs = [e["message"] for e in _events(tmp_path / "run") if e["type"] == "log"]
    assert any(m.startswith("harness split noise floor:") for m in logs)


# ---------------------------------------------------------------- one harness host per candidate


def test_one_candidate_starts_exactly_one_harness_host(
    tmp_path: Path, backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from whale_lab.harness.host import HarnessHost

    started: list[Path] = []
    init = HarnessHost.__init__

    def counting(self: HarnessHost, path: Any, *args: Any, **kwargs: Any) -> None:
        started.append(Path(path).resolve())
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(HarnessHost, "__init__", counting)
    cfg = make_cfg(tmp_path)
    phase = _phase(cfg, backend, tmp_path / "run")
    result = phase.run(H0_PATH, iterations=2)
    assert result.status == "completed"
    archive = phase.archive
    for cid in archive.ids()[1:]:  # the proposed candidates: contract check, smoke run, scoring
        path = (archive.folder(cid) / "harness.py").resolve()
        assert archive.read(cid, "smoke")["rollouts"] == 1 and len(list(archive.traces(cid))) == 3
        assert started.count(path) == 1, cid
    assert phase.hosts.started == len(archive.ids())  # one each, the incoming's scoring too
    assert not phase.hosts._hosts  # none left running after the phase
    phase.store.close()


class _FakeHost:
    def __init__(self, path: Path) -> None:
        self.code = path.read_text()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_an_edited_candidate_gets_a_new_host_and_the_old_one_is_closed(tmp_path: Path) -> None:
    from whale_lab.search.candidate_hosts import CandidateHosts

    path = tmp_path / "harness.py"
    path.write_text("A = 1\n")
    hosts = CandidateHosts(_FakeHost)
    first = hosts.get("c001", path)
    assert hosts.opener("c001", path)() is first and hosts.started == 1
    path.write_text("A = 2\n")  # a reviewer's edit
    second = hosts.get("c001", path)
    assert second is not first and first.closed and second.code == "A = 2\n"
    with hosts.held("c002"):
        third = hosts.get("c002", path)
    assert third.closed and hosts.started == 3
    hosts.close()
    assert second.closed
