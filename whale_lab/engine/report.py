"""Reading results back out of run folders: val-selected test scores, curves, comparison reports.

Everything here is derived from `events.jsonl`, so a report can be rebuilt from the runs alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from whale_lab import events as ev
from whale_lab.metrics import VAL_TIE_TOL
from whale_lab.paired import METHOD, paired_difference
from whale_lab.store import RunStore, atomic_write_json, atomic_write_text

# two-sided 95% Student-t quantiles by degrees of freedom (1..10); normal beyond
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
}


@dataclass
class CurvePoint:
    rollouts: int
    weight_rollouts: int
    harness_rollouts: int
    val: float
    test: float | None
    checkpoint: str
    cycle: int
    phase: str


@dataclass
class RunSummary:
    run_dir: str
    domain: str = ""
    schedule: str = ""
    seed: int = 0
    status: str = "unfinished"
    selected_val: float | None = None
    selected_test: float | None = None  # test score at the best-on-val checkpoint (reported)
    # best test score over the checkpoints scored on test (the paper's way); with
    # eval.test_every = "best" those are only the points that were a new best on val
    best_test: float | None = None
    tested_points: int = 0  # evaluation points with a test score (what best_test is taken over)
    selected_checkpoint: str = ""
    weight_rollouts: int = 0
    harness_rollouts: int = 0
    proposer_tokens: int = 0
    proposer_cost: float = 0.0
    curve: list[CurvePoint] = field(default_factory=list)
    proposals: int = 0  # candidates the proposers wrote (the harness budget in proposals)
    selection_rule: str = ""  # which rule chose the selected checkpoint (a val tie says how)
    # per evaluation point and split: task id -> rewards (None: an invalid episode)
    episodes: dict[str, dict[str, dict[str, list[float | None]]]] = field(
        default_factory=dict, repr=False
    )

    @property
    def rollouts(self) -> int:
        return self.weight_rollouts + self.harness_rollouts

    def selected_scores(self, split: str = "test") -> dict[str, list[float | None]]:
        """Per-task rewards of `split` at the val-selected checkpoint (for paired comparisons)."""
        return self.episodes.get(self.selected_checkpoint, {}).get(split, {})


def _eval_split(ep: ev.EpisodeFinished) -> str:
    """The split an evaluation episode was scored for, read from its trace file
    (`traces/eval-<split>.jsonl`); "" when the episode does not say."""
    stem = Path(ep.trace_path).stem if ep.trace_path else ""
    return stem.removeprefix("eval-") if stem.startswith("eval-") else ""


def summarise_run(run_dir: str | Path) -> RunSummary:
    store_events = RunStore.read_events(run_dir)
    s = RunSummary(run_dir=str(run_dir))
    val_by_ckpt: dict[str, ev.EvalResult] = {}
    test_by_ckpt: dict[str, ev.EvalResult] = {}
    order: list[str] = []
    pending: list[ev.EpisodeFinished] = []  # eval episodes not yet claimed by an EvalResult
    for e in store_events:
        if isinstance(e, ev.EpisodeFinished) and e.phase == "eval":
            pending.append(e)
            continue
        if isinstance(e, ev.CandidateProposed) and e.proposer != "incoming":
            s.proposals += 1
        if isinstance(e, ev.RunStarted):
            s.domain, s.schedule = e.domain, e.schedule
            s.seed = int(e.config.get("run", {}).get("seed", 0)) if e.config else 0
        elif isinstance(e, ev.EvalResult):
            key = e.checkpoint or f"{e.cycle}-{e.phase}"
            by_task: dict[str, list[float | None]] = {}
            # a point scores its splits before it reports them: each result claims its own
            # split's episodes (and those that name none)
            mine = [ep for ep in pending if _eval_split(ep) in ("", e.split)]
            for ep in mine:
                invalid = ep.stop_reason == "backend_error"
                by_task.setdefault(ep.task_id, []).append(None if invalid else ep.reward)
            s.episodes.setdefault(key, {})[e.split] = by_task
            pending = [ep for ep in pending if _eval_split(ep) not in ("", e.split)]
            if e.split == "val":
                if key not in val_by_ckpt:
                    order.append(key)
                val_by_ckpt[key] = e
            elif e.split == "test":
                test_by_ckpt[key] = e
            s.weight_rollouts = max(s.weight_rollouts, e.weight_rollouts)
            s.harness_rollouts = max(s.harness_rollouts, e.harness_rollouts)
        elif isinstance(e, ev.PhaseEnded):
            s.weight_rollouts = max(s.weight_rollouts, e.weight_rollouts)
            s.harness_rollouts = max(s.harness_rollouts, e.harness_rollouts)
        elif isinstance(e, ev.ProposerUsage):
            s.proposer_tokens += e.prompt_tokens + e.completion_tokens
            s.proposer_cost += e.cost
        elif isinstance(e, ev.RunFinished):
            s.status = e.status
    for key in order:
        v = val_by_ckpt[key]
        t = test_by_ckpt.get(key)
        s.curve.append(
            CurvePoint(
                rollouts=v.weight_rollouts + v.harness_rollouts,
                weight_rollouts=v.weight_rollouts,
                harness_rollouts=v.harness_rollouts,
                val=v.mean_at_k,
                test=t.mean_at_k if t else None,
                checkpoint=key,
                cycle=v.cycle,
                phase=v.phase,
            )
        )
    if s.curve:
        best, s.selection_rule = select_on_val(s.curve, s.episodes)
        s.selected_val, s.selected_test, s.selected_checkpoint = (
            best.val,
            best.test,
            best.checkpoint,
        )
        tests = [p.test for p in s.curve if p.test is not None]
        s.best_test = max(tests) if tests else None
        s.tested_points = len(tests)
    return s


def select_on_val(
    curve: list[CurvePoint], episodes: dict[str, dict[str, dict[str, list[float | None]]]]
) -> tuple[CurvePoint, str]:
    """The best point on val, and the rule that chose it.

    Points whose val means tie are told apart on val alone, paired: walking the tied points in
    rollout order, a later point replaces the one held when it wins more val tasks than it loses
    against it (then: a higher paired mean on the shared tasks, which differs from the tie only
    where episodes were invalid); otherwise the earlier point, with fewer rollouts, stays. Test
    never decides. Under `eval.test_every = "best"` a point that ties the best val is scored on
    test too (`metrics.reaches_best`), so every tied point takes part; a tied point without a test
    score (a run recorded before that rule) is left out, and the rule says so.
    """
    top = max(p.val for p in curve)
    tied = [p for p in curve if math.isclose(p.val, top, rel_tol=0.0, abs_tol=VAL_TIE_TOL)]
    if len(tied) == 1:
        return tied[0], "best on val"
    tested = [p for p in tied if p.test is not None]
    pool = sorted(tested or tied, key=lambda p: p.rollouts)
    untested = len(tied) - len(pool)
    held, reasons = pool[0], []
    for later in pool[1:]:
        a = episodes.get(held.checkpoint, {}).get("val", {})
        b = episodes.get(later.checkpoint, {}).get("val", {})
        r = paired_difference(a, b, resamples=1) if a and b else None
        if r is None or r.n_tasks == 0:
            reasons.append(f"{_short(later.checkpoint)}: no paired val episodes, earlier kept")
            continue
        tally = f"{r.wins} wins / {r.losses} losses / {r.ties} ties on {r.n_tasks} val tasks"
        if (r.wins - r.losses, r.diff) > (0, 1e-12):
            reasons.append(f"{_short(later.checkpoint)} over {_short(held.checkpoint)}: {tally}")
            held = later
        else:
            reasons.append(f"{_short(held.checkpoint)} over {_short(later.checkpoint)}: {tally}")
    rule = (
        f"val tie at {100 * top:.2f} among {len(tied)} points, broken by the later point's "
        f"paired val score against the earlier one (wins minus losses, then paired mean; "
        f"no gain keeps the earlier): {'; '.join(reasons)}"
    )
    if untested:
        rule += (
            f"; {untested} tied point(s) without a test score left out "
            '(eval.test_every = "always" scores them)'
        )
    return held, rule


def _short(checkpoint: str) -> str:
    return Path(checkpoint).name or checkpoint


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a 95% t-interval (0 for a single value)."""
    if not values:
        return math.nan, math.nan
    m = statistics.fmean(values)
    if len(values) < 2:
        return m, 0.0
    sem = statistics.stdev(values) / math.sqrt(len(values))
    return m, _T95.get(len(values) - 1, 1.96) * sem


def _fmt(m: float, h: float) -> str:
    if math.isnan(m):
        return "n/a"
    return f"{100 * m:.2f} ± {100 * h:.2f}" if h else f"{100 * m:.2f}"


def write_comparison(report_dir: str | Path, runs: list[RunSummary], *, title: str = "") -> Path:
    """The paper's main-table layout plus curves, as Markdown, JSON, PNG and SVG."""
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_schedule: dict[str, list[RunSummary]] = defaultdict(list)
    for r in runs:
        by_schedule[r.schedule].append(r)
    rows = []
    for schedule, rs in by_schedule.items():
        sel = [r.selected_test for r in rs if r.selected_test is not None]
        best = [r.best_test for r in rs if r.best_test is not None]
        rows.append(
            {
                "schedule": schedule,
                "seeds": len(rs),
                "test_at_best_val": mean_ci(sel),
                "best_on_test": mean_ci(best),
                "weight_rollouts": statistics.fmean([r.weight_rollouts for r in rs]),
                "harness_rollouts": statistics.fmean([r.harness_rollouts for r in rs]),
                "proposer_tokens": statistics.fmean([r.proposer_tokens for r in rs]),
                "proposals": statistics.fmean([r.proposals for r in rs]),
            }
        )
    rows.sort(
        key=lambda r: (
            -(r["test_at_best_val"][0] if not math.isnan(r["test_at_best_val"][0]) else -1)
        )
    )
    domain = runs[0].domain if runs else ""
    lines = [
        f"# {title or 'Schedule comparison'}" + (f" ({domain})" if domain else ""),
        "",
        "Test mean@k (%) at the checkpoint that is best on val, mean ± 95% t-interval across seeds. "
        "The best-on-test column is the paper's way of selecting, shown for comparison only; it "
        'is taken over the evaluation points scored on test (with eval.test_every = "best", '
        "only those that were a new best on val).",
        "",
        "| schedule | seeds | test @ best val | best on test (paper's way) over tested points | "
        "weight rollouts | harness rollouts | proposals | proposer tokens |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['schedule']} | {r['seeds']} | {_fmt(*r['test_at_best_val'])} | "
            f"{_fmt(*r['best_on_test'])} | {r['weight_rollouts']:.0f} | "
            f"{r['harness_rollouts']:.0f} | {r['proposals']:.0f} | {r['proposer_tokens']:.0f} |"
        )
    lines += ["", "![val mean@k vs rollouts](accuracy_vs_rollouts.svg)", "", "Runs:", ""]
    lines += [f"- {r.schedule} seed {r.seed}: `{r.run_dir}` ({r.status})" for r in runs]
    paired = paired_comparisons(runs)
    lines[4:4] = _paired_lines(paired) + [""]
    atomic_write_text(out / "summary.md", "\n".join(lines) + "\n")
    atomic_write_json(out / "paired.json", paired)
    atomic_write_json(
        out / "results.json",
        {
            "rows": [
                {
                    **r,
                    "test_at_best_val": list(r["test_at_best_val"]),
                    "best_on_test": list(r["best_on_test"]),
                }
                for r in rows
            ],
            "runs": [_run_json(r) for r in runs],
        },
    )
    _plot(out, runs)
    return out / "summary.md"


BASELINES = ("weight-only", "harness-only", "stagewise", "prompt-only", "best-of-n")


def _run_json(r: RunSummary) -> dict[str, Any]:
    d = asdict(r)
    d.pop("episodes", None)
    return d


def paired_comparisons(runs: list[RunSummary]) -> dict[str, Any]:
    """Every schedule against each baseline, paired on the test tasks at each run's val-selected
    checkpoint; the interval is a bootstrap over units. With fixed splits (every run scored the
    same test tasks) the unit is a task, its samples pooled over the seeds, so a task that is
    easy under every seed counts once; with re-drawn splits the unit is a (seed, task) pair."""
    by: dict[str, dict[int, RunSummary]] = defaultdict(dict)
    for r in runs:
        by[r.schedule][r.seed] = r
    task_sets = {frozenset(r.selected_scores()) for r in runs if r.selected_scores()}
    fixed = len(task_sets) == 1
    schedules = list(by)
    baselines = [b for b in BASELINES if b in by] or schedules[:1]
    pairs = []
    done: set[tuple[str, str]] = set()
    for base in baselines:
        for other in schedules:
            if other == base or (base, other) in done:
                continue  # one direction per pair of schedules
            done.add((other, base))
            a: dict[str, list[float | None]] = {}
            b: dict[str, list[float | None]] = {}
            seeds = sorted(set(by[base]) & set(by[other]))
            for seed in seeds:
                for side, name in ((a, base), (b, other)):
                    for task, vals in by[name][seed].selected_scores().items():
                        side.setdefault(task if fixed else f"{seed}/{task}", []).extend(vals)
            result = paired_difference(a, b, seed=len(pairs))
            pairs.append(
                {
                    "schedule": other,
                    "baseline": base,
                    "seeds": seeds,
                    "weight_rollouts": [
                        statistics.fmean([by[x][sd].weight_rollouts for sd in seeds])
                        if seeds
                        else 0
                        for x in (other, base)
                    ],
                    "harness_rollouts": [
                        statistics.fmean([by[x][sd].harness_rollouts for sd in seeds])
                        if seeds
                        else 0
                        for x in (other, base)
                    ],
                    "proposals": [
                        statistics.fmean([by[x][sd].proposals for sd in seeds]) if seeds else 0
                        for x in (other, base)
                    ],
                    **result.to_dict(),
                    "says": result.describe(unit=" pts", scale=100),
                }
            )
    return {
        "unit": (
            "test task (samples pooled over the seeds) at each run's val-selected checkpoint"
            if fixed
            else "(seed, test task) at each run's val-selected checkpoint"
        ),
        "method": METHOD,
        "level": 0.95,
        "pairs": pairs,
    }


def _paired_lines(paired: dict[str, Any]) -> list[str]:
    if not paired["pairs"]:
        return []
    lines = [
        "Paired differences (schedule minus baseline, test mean@k points at the val-selected "
        f"checkpoints; unit: {paired['unit']}; 95% {paired['method']}). Only an interval "
        "that excludes zero supports a difference.",
        "",
        "| schedule | baseline | difference | 95% interval | wins / losses / ties | "
        "what it supports | proposals (schedule / baseline) |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in paired["pairs"]:
        if p["n_tasks"] == 0 or p["low"] is None or p["high"] is None:
            lines.append(
                f"| {p['schedule']} | {p['baseline']} | - | - | - | "
                f"too few shared tasks ({p['n_tasks']}) | - |"
            )
            continue
        if p["excludes_zero"]:
            says = "a difference" + (" (schedule ahead)" if p["diff"] > 0 else " (baseline ahead)")
        else:
            need = p.get("needed_tasks")
            says = "no difference detected at this size" + (
                f" (~{need} units needed)" if need else ""
            )
        lines.append(
            f"| {p['schedule']} | {p['baseline']} | {100 * p['diff']:+.1f} | "
            f"[{100 * p['low']:+.1f}, {100 * p['high']:+.1f}] | "
            f"{p['wins']} / {p['losses']} / {p['ties']} | {says} | "
            f"{p['proposals'][0]:.0f} / {p['proposals'][1]:.0f} |"
        )
    return lines


def _plot(out: Path, runs: list[RunSummary]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    colors: dict[str, Any] = {}
    cmap = plt.get_cmap("tab10")
    for r in runs:
        if not r.curve:
            continue
        color = colors.setdefault(r.schedule, cmap(len(colors) % 10))
        xs = [p.rollouts for p in r.curve]
        ys = [100 * p.val for p in r.curve]
        label = (
            r.schedule if r.schedule not in {line.get_label() for line in ax.get_lines()} else None
        )
        ax.plot(xs, ys, marker="o", markersize=3, color=color, alpha=0.85, label=label)
    ax.set_xlabel("rollouts (weight + harness)")
    ax.set_ylabel("val mean@k (%)")
    ax.grid(alpha=0.3)
    if colors:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_rollouts.png")
    fig.savefig(out / "accuracy_vs_rollouts.svg")
    plt.close(fig)


def load_summaries(paths: list[str | Path]) -> list[RunSummary]:
    return [summarise_run(p) for p in paths]


def summary_json(s: RunSummary) -> str:
    return json.dumps(_run_json(s), indent=2)
