"""`whale-lab`: parse the command line and hand it to the sub-command's module.

Each sub-command lives in `whale_lab.commands.<name>` and is imported only when it runs, so
`whale-lab --help` stays fast. With no sub-command (or `tui`, or `run` / `resume` without
`--headless`) the TUI opens.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from whale_lab.config import Config, find_default_config, load_config
from whale_lab.errors import WhaleLabError
from whale_lab.threads import configure as configure_threads


def _add_common(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    # Subcommands repeat the options with SUPPRESS defaults so that a value given before the
    # subcommand is not overwritten by the subparser's default. A subcommand's `--set` list goes
    # to its own dest: argparse replaces, not extends, the outer list with the inner one, which
    # would drop every `--set` given before the subcommand (`_merge_overrides` joins them).
    p.add_argument("--config", "-c", default=None if top else argparse.SUPPRESS,
                   help="path to whale.toml (default: ./whale.toml, else the project's)")
    p.add_argument("--set", dest="overrides" if top else "sub_overrides", action="append",
                   default=[] if top else argparse.SUPPRESS, metavar="KEY=VALUE",
                   help="override one config key, e.g. --set domain.name=chess (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whale-lab",
        description="A terminal lab for jointly optimising an LLM agent's weights and its harness.",
        epilog="Exit codes: 0 done, 1 the engine failed, 2 a mistake in the command, config, data "
        "or harness (one line says which), 130 interrupted (143 on SIGTERM).",
    )
    from whale_lab import __version__

    parser.add_argument("--version", action="version", version=f"whale-lab {__version__}")
    _add_common(parser, top=True)
    sub = parser.add_subparsers(dest="command")

    p = sub.add_parser("tui", help="open the app (the default), optionally on an existing run")
    _add_common(p)
    p.add_argument("--run", default=None, help="run folder to open (an unfinished run is resumed)")
    p.add_argument("--view", action="store_true",
                   help="only show the run folder (replay its events); do not start the engine")

    p = sub.add_parser("eval", help="score a harness on a split: mean@k, pass@k and diagnostics")
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--harness", default=None, help="harness file (default: harnesses/<domain>/h0.py)")
    p.add_argument("--split", choices=["weight", "harness", "val", "test"], default="val")
    p.add_argument("--k", type=int, default=None, help="samples per task (default: sampling.k)")
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks of the split")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser("train", help="weight-only RSFT under one fixed harness (resumable)")
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--harness", default=None)
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="resume a killed train run")
    p.add_argument("--adapter", default=None, metavar="DIR", help="start from this LoRA adapter")

    p = sub.add_parser(
        "search",
        help="harness-only Meta-Harness search on fixed weights (resumable)",
        description="Harness-only Meta-Harness search on fixed weights (resumable). Candidates "
        "come from proposer.kind: rules (the offline default), llm, manual or claude-code.",
        epilog="The rules proposer is a deterministic catalogue of trace-triggered mechanisms: a "
        "baseline and an offline stand-in for an LLM proposer. It does not read the harness "
        "code the way an LLM proposer does; it counts failure patterns in the parent's traces "
        "and applies the matching edits from a fixed catalogue, one per candidate. An edit the "
        "parent's limits (MAX_TURNS, retry budgets) leave no room to act is skipped, or comes "
        "with the raised limit where that is part of the edit's idea. "
        "Use proposer.kind = \"llm\" for a proposer that reads the archive and writes its own "
        "edits.",
    )
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--harness", default=None, help="incoming harness (default: h0)")
    p.add_argument("--resume", default=None, metavar="RUN_DIR", help="resume a killed search run")
    p.add_argument("--replay-proposer", default=None, metavar="PATH",
                   help="replay the proposer sessions recorded in a phase archive or run folder "
                        "(no request to any endpoint; sets proposer.replay)")

    p = sub.add_parser("run", help="run the configured schedule (WHALE by default)")
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--schedule", default=None,
                   choices=["whale", "adaptive", "weight-only", "harness-only", "stagewise", "prompt-only"])
    p.add_argument("--headless", action="store_true",
                   help="no app: a progress display, approval.headless_mode (auto by default)")

    p = sub.add_parser("resume", help="resume a run folder from its last completed step")
    _add_common(p)
    p.add_argument("run_dir", help="the run folder (runs/<id>)")
    p.add_argument("--headless", action="store_true", help="resume without the app")

    p = sub.add_parser("probe", help="bottleneck probe: is the harness or the weights holding us back?")
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--run", default=None, help="probe an existing run's current weights and harness")
    p.add_argument("--keep", nargs="?", const="best", default=None,
                   choices=["best", "weights", "harness", "both"],
                   help="keep a probe's result in the run (default: keep nothing)")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (per side: gain_per_1k, interval, verdict)")
    p.add_argument("--interaction", action="store_true",
                   help="the harness x weights interaction on --run: incumbent and best candidate "
                        "of the last harness phase, before and after the last weight phase")

    p = sub.add_parser("compare", help="run schedules x seeds on one domain and write a report")
    _add_common(p)
    p.add_argument("--domain", choices=["math", "search", "chess"], default=None)
    p.add_argument("--schedules", default="whale,weight-only,harness-only,prompt-only,stagewise",
                   help="comma-separated schedule names")
    p.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    p.add_argument("--out", default=None, help="report folder (default: runs/compare-<date>)")
    p.add_argument("--resplit", action="store_true",
                   help="let every seed draw its own splits (default: one task set for all, paired)")

    p = sub.add_parser("check", help="the sandbox in force for untrusted code, and its limits")
    _add_common(p)
    p.add_argument("--attack", action="store_true",
                   help="also run a few escapes as tool code and say whether each was stopped")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = sub.add_parser("micro", help="the embedded micro model: pre-train it or measure calibration")
    micro = p.add_subparsers(dest="micro_command", required=True)
    from whale_lab.commands import micro as _micro

    mp = micro.add_parser("pretrain", help="train the micro model from scratch on generated transcripts")
    _micro.add_pretrain_arguments(mp)
    mc = micro.add_parser("calibrate", help="val mean@k under h0 and a stronger harness, per domain")
    _add_common(mc)
    _micro.add_calibrate_arguments(mc)
    return parser


def _load(args: argparse.Namespace) -> Config:
    path = args.config
    if path is None:
        found = find_default_config()
        path = str(found) if found else None
    overrides = list(args.overrides)
    domain = getattr(args, "domain", None)
    if domain:
        overrides.append(f"domain.name={domain!r}".replace("'", '"'))
    harness = getattr(args, "harness", None)
    if harness:
        overrides.append(f'domain.harness="{Path(harness)}"')
    return load_config(path, overrides)


def _merge_overrides(args: argparse.Namespace) -> None:
    """Every `--set`, those before the subcommand first, so a later one wins on the same key."""
    args.overrides = [*getattr(args, "overrides", []), *getattr(args, "sub_overrides", [])]
    args.sub_overrides = []


def _dispatch(args: argparse.Namespace) -> int:
    _merge_overrides(args)
    command = args.command or "tui"
    if command == "micro" and args.micro_command == "pretrain":
        from whale_lab.commands.micro import run_pretrain

        return run_pretrain(args)
    if command == "resume":
        if args.headless:
            from whale_lab.commands.run import run_resume

            return run_resume(args.run_dir)
        from whale_lab.tui import run_tui

        return run_tui(_load(args), run_dir=args.run_dir)
    if getattr(args, "schedule", None):
        args.overrides.append(f'schedule.kind="{args.schedule}"')
    if command == "search" and args.replay_proposer:
        import json

        from whale_lab.config import ConfigError

        if args.resume is not None:
            raise ConfigError("--replay-proposer: a resumed search keeps its recorded config; "
                              "start a new search to replay")
        replay = Path(args.replay_proposer).expanduser().resolve()
        if not replay.exists():
            raise ConfigError(f"--replay-proposer: {replay} does not exist")
        args.overrides.append(f"proposer.replay={json.dumps(str(replay))}")
    cfg = _load(args)
    if command == "eval":
        from whale_lab.commands.eval import run_eval

        return run_eval(cfg, harness=args.harness, split=args.split, k=args.k, as_json=args.json,
                        limit=args.limit)
    if command == "train":
        from whale_lab.commands.train import run_train

        return run_train(cfg, run_dir=args.resume, resume=args.resume is not None, adapter=args.adapter)
    if command == "search":
        from whale_lab.commands.search import run_search

        return run_search(cfg, run_dir=args.resume, resume=args.resume is not None)
    if command == "tui":
        from whale_lab.tui.app import run_tui

        return run_tui(cfg, run_dir=getattr(args, "run", None), replay_only=getattr(args, "view", False))
    if command == "run":
        if args.headless:
            from whale_lab.commands.run import run_headless

            return run_headless(cfg)
        from whale_lab.tui import run_tui

        return run_tui(cfg)
    if command == "probe":
        from whale_lab.commands.probe import run_interaction_probe, run_probe

        if args.interaction:
            if args.keep is not None:
                print("whale-lab: error: --keep does not apply to --interaction (it keeps nothing)",
                      file=sys.stderr)
                return 2
            return run_interaction_probe(cfg, args.run, as_json=args.json)
        keep: bool | str = False if args.keep is None else (True if args.keep == "best" else args.keep)
        return run_probe(cfg, run_dir=args.run, keep=keep, as_json=args.json)
    if command == "compare":
        from whale_lab.commands.compare import compare_command

        return compare_command(cfg, args.schedules, args.seeds, args.out, resplit=args.resplit)
    if command == "check":
        from whale_lab.commands.check import run_check

        return run_check(cfg, attack=args.attack, as_json=args.json)
    if command == "micro":
        from whale_lab.commands.micro import run_calibrate

        return run_calibrate(cfg, args)
    raise AssertionError(command)  # pragma: no cover


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_threads()  # before anything imports torch, which reads the count at import
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        print("whale-lab: interrupted", file=sys.stderr)
        return 130
    except (WhaleLabError, FileNotFoundError) as exc:
        print(f"whale-lab: error: {exc}", file=sys.stderr)
        if os.environ.get("WHALE_LAB_DEBUG"):
            raise
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
