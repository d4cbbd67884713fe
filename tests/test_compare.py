"""`compare`, `run --headless`, `resume` and `probe` entry points on the embedded math domain
with the tiny random model and short budgets (the path a user takes from the command line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from whale_lab.commands.common import EXIT_OK, EXIT_USAGE
from whale_lab.commands.compare import run_compare
from whale_lab.commands.probe import run_probe
from whale_lab.commands.run import run_headless, run_resume
from whale_lab.config import Config, load_config
from whale_lab.store import RunStore, read_json

SHORT = [
    "model.path=tiny-random",
    "domain.splits.weight=8",
    "domain.splits.harness=2",
    "domain.splits.val=2",
    "domain.splits.test=2",
    "sampling.k=2",
    "sampling.max_new_tokens=8",
    "rsft.prompts_per_step=2",
    "rsft.samples_per_prompt=2",
    "rsft.eval_every=10.0",
    "harness_search.candidates_per_iteration=2",
    "harness_search.smoke_tasks=2",
    "schedule.cycles=1",
    "schedule.weight_epochs=0.25",
    "schedule.first_weight_epochs=0",
    "schedule.harness_iterations=2",
    "schedule.total_weight_epochs=0.25",
    "schedule.total_harness_iterations=2",
    'approval.mode="manual"',  # headless and compare use approval.headless_mode (auto)
]


def short_config(tmp: Path, *more: str) -> Config:
    return load_config(None, [*SHORT, f'run.directory="{tmp / "runs"}"', *more])


def test_compare_runs_schedules_by_seeds_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = short_config(tmp_path)
    out = tmp_path / "cmp"
    assert run_compare(cfg, ["weight-only", "harness-only"], [0], out) == EXIT_OK
    for name in ("weight-only-seed0", "harness-only-seed0"):
        state = read_json(out / name / "state.json")
        assert state["status"] == "completed" and state["schedule"] == name.split("-seed")[0]
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "| weight-only | 1 |" in summary and "| harness-only | 1 |" in summary
    assert "best on test (paper's way)" in summary
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert {r["schedule"] for r in results["rows"]} == {"weight-only", "harness-only"}
    assert (out / "accuracy_vs_rollouts.png").stat().st_size > 0
    assert (out / "accuracy_vs_rollouts.svg").stat().st_size > 0
    events_before = (out / "weight-only-seed0" / "events.jsonl").read_bytes()
    # the same comparison again: completed runs are not run twice
    assert run_compare(cfg, ["weight-only", "harness-only"], [0], out) == EXIT_OK
    assert (out / "weight-only-seed0" / "events.jsonl").read_bytes() == events_before
    assert "already completed" in capsys.readouterr().err


def test_compare_refuses_bad_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = short_config(tmp_path)
    assert run_compare(cfg, ["whales"], [0], tmp_path / "c") == EXIT_USAGE
    assert "unknown schedule 'whales' (did you mean 'whale'?)" in capsys.readouterr().err
    assert run_compare(cfg, ["whale"], [-1], tmp_path / "c") == EXIT_USAGE
    assert "seeds must be integers >= 0" in capsys.readouterr().err
    manual = short_config(tmp_path, 'approval.headless_mode="manual"')
    assert run_compare(manual, ["whale"], [0], tmp_path / "c") == EXIT_USAGE
    assert "headless_mode" in capsys.readouterr().err


def test_headless_run_then_resume_and_probe_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = short_config(tmp_path, 'schedule.kind="whale"')
    assert run_headless(cfg) == EXIT_OK
    (run,) = list((tmp_path / "runs").iterdir())
    err = capsys.readouterr().err
    assert "selected on val" in err and "the paper's way" in err
    state = read_json(run / "state.json")
    assert state["status"] == "completed"
    assert read_json(run / "config.json")["approval"]["mode"] == "auto"
    # resuming a completed run changes nothing
    assert run_resume(run) == EXIT_OK
    assert "already completed" in capsys.readouterr().err
    # a probe on the finished run: it leaves weights and harness as they were
    assert run_probe(cfg, str(run)) == EXIT_OK
    err = capsys.readouterr().err
    assert "bottleneck probe" in err
    after = read_json(run / "state.json")
    assert after["harness"] == state["harness"] and after["kept_weights"] == 0
    assert len(after["probes"]) == 1
    events = RunStore.read_events(run)
    assert events[-1].type == "run_finished"
    assert any(e.type == "probe_result" for e in events)
    # user mistakes: one line, exit code 2
    assert run_resume(tmp_path / "nope") == EXIT_USAGE
    assert "not found" in capsys.readouterr().err
    assert run_probe(cfg, str(run), keep="sometimes") == EXIT_USAGE
    assert "--keep" in capsys.readouterr().err


def test_compare_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from whale_lab.cli import main

    sets = [a for s in SHORT for a in ("--set", s)]
    sets += ["--set", f'run.directory="{tmp_path / "runs"}"']
    out = tmp_path / "cmp"
    argv = ["compare", "--schedules", "weight-only", "--seeds", "0", "--out", str(out), *sets]
    assert main(argv) == EXIT_OK
    assert "| weight-only | 1 |" in (out / "summary.md").read_text(encoding="utf-8")
    assert main(["compare", "--seeds", "0,x", "--out", str(out), *sets]) == EXIT_USAGE
    assert "--seeds must be integers" in capsys.readouterr().err


def test_every_lazy_import_of_the_cli_resolves() -> None:
    """The CLI imports each command's module only when it runs; a wrong name must fail here."""
    import ast
    import importlib

    import whale_lab.cli as cli

    tree = ast.parse(Path(cli.__file__).read_text(encoding="utf-8"))
    lazy = [
        node
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for node in ast.walk(fn)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("whale_lab")
    ]
    assert len(lazy) >= 8
    for node in lazy:
        module = importlib.import_module(node.module)
        for alias in node.names:
            if not hasattr(module, alias.name):  # a submodule, imported on first use
                importlib.import_module(f"{node.module}.{alias.name}")
            assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"


def test_compare_keeps_the_splits_fixed_across_seeds_unless_resplit(tmp_path: Path) -> None:
    from whale_lab.domains import make_domain
    from whale_lab.engine.compare import run_config

    cfg = short_config(tmp_path)

    def ids(c: Config) -> list[str]:
        d = make_domain(c)
        return [t.fields["question"] for s in ("val", "test") for t in d.tasks(s)]

    fixed = [run_config(cfg, "whale", seed, tmp_path, split_seed=0) for seed in (0, 1)]
    assert fixed[0].run.seed != fixed[1].run.seed  # the seed still varies sampling and training
    assert ids(fixed[0]) == ids(fixed[1])
    resplit = [run_config(cfg, "whale", seed, tmp_path) for seed in (0, 1)]
    assert ids(resplit[0]) != ids(resplit[1])


def test_best_of_n_runs_beside_harness_only_with_the_same_proposals(tmp_path: Path) -> None:
    """The control row: catalogue draws, no search, harness-only's proposal budget."""
    cfg = short_config(tmp_path, "schedule.total_harness_iterations=3")
    out = tmp_path / "cmp"
    assert run_compare(cfg, ["harness-only", "best-of-n"], [0], out) == EXIT_OK
    phase = out / "best-of-n-seed0" / "harness_phases" / "cycle-01" / "candidates"
    proposers = {
        read_json(p / "meta.json")["proposer"] for p in phase.iterdir() if (p / "meta.json").exists()
    }
    assert proposers == {"incoming", "draw"}
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    rows = {r["schedule"]: r for r in results["rows"]}
    assert set(rows) == {"harness-only", "best-of-n"}
    assert rows["best-of-n"]["proposals"] <= 4 and rows["harness-only"]["proposals"] <= 4
    summary = (out / "summary.md").read_text(encoding="utf-8")
    assert "| proposals |" in summary
    paired = json.loads((out / "paired.json").read_text(encoding="utf-8"))
    pairs = [(p["schedule"], p["baseline"]) for p in paired["pairs"]]
    assert pairs == [("best-of-n", "harness-only")]  # one direction per pair of schedules


def test_a_comparison_split_over_processes_keeps_one_task_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--seeds 1` alone draws its tasks with split seed 1, the first of its seeds: run into a
    folder that holds seed 0's runs (split seed 0), its runs would be pooled with theirs as if
    they shared tasks. It is refused with the fix; with the split seed fixed it runs, and the
    runs share their tasks."""
    cfg = short_config(tmp_path)
    out = tmp_path / "cmp"
    assert run_compare(cfg, ["weight-only"], [0], out) == EXIT_OK
    capsys.readouterr()
    assert run_compare(cfg, ["weight-only"], [1], out) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "weight-only-seed0 drew its tasks with domain.split_seed 0" in err
    assert "--set domain.split_seed=0" in err and len(err.strip().splitlines()) == 1
    assert not (out / "weight-only-seed1").exists()
    fixed = short_config(tmp_path, "domain.split_seed=0")
    assert run_compare(fixed, ["weight-only"], [1], out) == EXIT_OK
    tasks = [
        {json.loads(line)["task_id"] for line in (out / run / "traces" / "eval-test.jsonl").open()}
        for run in ("weight-only-seed0", "weight-only-seed1")
    ]
    assert tasks[0] == tasks[1]
    # the whole comparison over both seeds now finds both runs completed and reports them
    assert run_compare(cfg, ["weight-only"], [0, 1], out) == EXIT_OK
    assert "| weight-only | 2 |" in (out / "summary.md").read_text(encoding="utf-8")
