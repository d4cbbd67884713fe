"""The Accuracy tab's plots, drawn from the view model into plotext figures.

Three questions a researcher asks of a run: did val and test move with the rollouts spent (and in
which phase were they spent), what did each harness iteration's candidates score (and which one
was kept), and is the weight phase learning (training reward and accept rate per step).
"""

from __future__ import annotations

from typing import Any

from whale_lab.tui.state import RunView

PHASE_LETTER = {"weight": "W", "harness": "H"}


def phase_spans(view: RunView) -> list[tuple[str, float, float]]:
    """(label, first rollout, last rollout) of every weight and harness phase so far; the
    running phase ends at the rollouts counted until now."""
    out: list[tuple[str, float, float]] = []
    start = 0.0
    for cycle, phase, end in view.phase_marks:
        if phase in PHASE_LETTER:
            out.append((f"{PHASE_LETTER[phase]}{cycle}", start, float(end)))
        start = float(end)
    now = float(view.weight_rollouts + view.harness_rollouts)
    if view.phase_active and view.phase in PHASE_LETTER and now > start:
        out.append((f"{PHASE_LETTER[view.phase]}{view.cycle}", start, now))
    return out


def draw_accuracy(plt: Any, view: RunView) -> None:
    """val and test mean@k against weight + harness rollouts, each phase's span labelled."""
    evals = view.evals
    if not evals:
        plt.title("no evaluations yet")
        return
    top = 0.0
    for split, color in (("val", "cyan"), ("test", "magenta")):
        pts = [p for p in evals if p.split == split]
        if not pts:
            continue
        ys = [100 * p.mean_at_k for p in pts]
        top = max(top, *ys)
        plt.plot(
            [p.rollouts for p in pts],
            ys,
            label=f"{split} mean@{pts[-1].k}",
            marker="braille",
            color=color,
        )
    label_y = min(100.0, top * 1.1 + 1)
    right = max([p.rollouts for p in evals] + [s[2] for s in phase_spans(view)])
    plt.xlim(0, max(1.0, float(right)))  # from 0, so the first phase's span shows
    for label, lo, hi in phase_spans(view):
        plt.vline(hi, color="gray")
        plt.text(label, (lo + hi) / 2, label_y, color="yellow" if label[0] == "W" else "green")
    plt.xlabel("rollouts: W = weight phase, H = harness phase (| = phase end)")
    plt.ylabel("%")


def candidate_points(view: RunView) -> list[tuple[int, str, float, bool]]:
    """(x, "cycle.iteration", success %, accepted) per scored candidate; x counts harness
    iterations over the whole run, so cycles follow each other left to right."""
    accepted = {row.accepted for row in view.cycles.values() if row.accepted}
    slots = sorted({(c.cycle, c.iteration) for c in view.candidates.values()})
    index = {slot: i for i, slot in enumerate(slots, start=1)}
    out = []
    for c in view.candidates.values():
        if c.success_rate is None:
            continue
        out.append(
            (
                index[(c.cycle, c.iteration)],
                f"{c.cycle}.{c.iteration}",
                100 * c.success_rate,
                c.candidate_id in accepted,
            )
        )
    return sorted(out)


def draw_candidates(plt: Any, view: RunView) -> None:
    pts = candidate_points(view)
    plt.title("candidates: success % per iteration")
    if not pts:
        plt.xlabel("no candidate scored yet")
        return
    plain = [p for p in pts if not p[3]]
    kept = [p for p in pts if p[3]]
    if plain:
        plt.scatter([p[0] for p in plain], [p[2] for p in plain], marker="•", color="cyan")
    if kept:
        plt.scatter(
            [p[0] for p in kept], [p[2] for p in kept], marker="◆", color="green", label="accepted"
        )
    plt.ylim(0, 100)
    ticks = sorted({(p[0], p[1]) for p in pts})
    plt.xticks([t[0] for t in ticks], [t[1] for t in ticks])
    plt.xlabel("cycle.iteration")


def draw_training(plt: Any, view: RunView) -> None:
    rewards, accepts = view.weight_series()
    plt.title("weight phase: per step")
    if not rewards:
        plt.xlabel("no weight step yet")
        return
    plt.ylim(0, 100)
    steps = list(range(1, len(rewards) + 1))
    plt.plot(
        steps, [100 * r for r in rewards], label="train reward %", marker="braille", color="cyan"
    )
    plt.plot(
        steps, [100 * a for a in accepts], label="accept rate %", marker="braille", color="yellow"
    )
    plt.xlabel("RSFT step in this phase")
