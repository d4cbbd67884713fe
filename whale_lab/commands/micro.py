"""`whale-lab micro pretrain` and `whale-lab micro calibrate`: the embedded micro model.

`pretrain` is the recipe in `whale_lab.micro.pretrain` (its options and `run_pretrain` live with
it, since `python -m whale_lab.micro.pretrain` runs it too). `calibrate` measures each domain with
`whale_lab.micro.calibrate.calibrate_domain` and prints the README's Markdown table on stdout
(progress goes to stderr). Importing this module stays light: `whale-lab --help` builds the
options of both.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from whale_lab.config import Config
from whale_lab.micro.calibrate import DOMAINS, CalibrationRow, calibrate_domain, markdown_table


def add_pretrain_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `whale-lab micro pretrain` (those of `python -m whale_lab.micro.pretrain`)."""
    from whale_lab.micro.pretrain import add_arguments

    add_arguments(p)


def run_pretrain(args: argparse.Namespace) -> int:
    """`whale-lab micro pretrain`: train the micro model from scratch; returns the exit status."""
    from whale_lab.micro.pretrain import run_pretrain as pretrain

    return pretrain(args)


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `whale-lab micro calibrate`."""
    p.add_argument(
        "--domain",
        dest="domains",
        choices=DOMAINS,
        action="append",
        default=None,
        help="a domain to measure (repeatable; default: all three)",
    )
    p.add_argument(
        "--tasks",
        type=int,
        default=128,
        help="val tasks per domain (default 128: there a paired lever's 95%% interval on the "
        "micro model is about +-6 points)",
    )
    p.add_argument("--k", type=int, default=8, help="samples per task (default 8)")
    p.add_argument(
        "--rsft-epochs",
        type=float,
        default=0.0,
        help="also run RSFT under h0 for this many epochs of the weight split and "
        "measure again (default 0: harness lever only)",
    )
    p.add_argument(
        "--held-out",
        action="store_true",
        help="score h0 and the stronger harness in formats pre-training never drew (wording, "
        "system prompt, passage layout, wrapper, feedback; the action tags stay h0's; math and "
        "search); RSFT still trains under h0",
    )
    p.add_argument(
        "--chess-variants",
        action="store_true",
        help="instead, score chess h0 against harnesses that differ from it in one thing each "
        "(every legal-move layout pre-training drew; 0, 3 or 10 illegal-move retries; retries "
        "from the clean position; forcing moves listed first), each paired against h0, with "
        "mean@k by what the puzzle's first move does",
    )
    p.add_argument(
        "--json",
        dest="json_out",
        default=None,
        metavar="PATH",
        help="also write the rows as JSON to PATH",
    )


def run_calibrate(cfg: Config, args: argparse.Namespace) -> int:
    """`whale-lab micro calibrate`: measure, print the Markdown table; returns the exit status."""
    from whale_lab.quiet import quiet_libraries

    quiet_libraries()
    if args.tasks < 1:
        print(f"whale-lab: error: --tasks must be >= 1, got {args.tasks}", file=sys.stderr)
        return 2
    if args.k < 1:
        print(f"whale-lab: error: --k must be >= 1, got {args.k}", file=sys.stderr)
        return 2
    if args.rsft_epochs < 0:
        print(
            f"whale-lab: error: --rsft-epochs must be >= 0, got {args.rsft_epochs}", file=sys.stderr
        )
        return 2
    domains = list(dict.fromkeys(args.domains or DOMAINS))
    held_out = getattr(args, "held_out", False)
    if getattr(args, "chess_variants", False):
        clash = [
            flag
            for flag, on in (
                ("--held-out", held_out),
                ("--rsft-epochs", args.rsft_epochs > 0),
                (
                    "--domain " + ",".join(d for d in domains if d != "chess"),
                    bool(args.domains) and domains != ["chess"],
                ),
            )
            if on
        ]
        if clash:
            print(
                f"whale-lab: error: --chess-variants measures chess h0 against its variants only; "
                f"drop {' and '.join(clash)}",
                file=sys.stderr,
            )
            return 2
        return _run_chess_variants(cfg, args)
    if held_out:
        from whale_lab.micro.styles import HELD_OUT

        missing = [d for d in domains if d not in HELD_OUT]
        if missing:
            print(
                f"whale-lab: error: --held-out has formats for {', '.join(sorted(HELD_OUT))}, "
                f"not {', '.join(missing)}: pass --domain for each",
                file=sys.stderr,
            )
            return 2
    rows: list[CalibrationRow] = []

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"calibrating {', '.join(domains)} on model {cfg.model.path!r}: val {args.tasks} tasks, "
        f"k={args.k}" + (f", RSFT {args.rsft_epochs:g} epochs" if args.rsft_epochs else "")
    )
    for d in domains:
        rows.append(
            calibrate_domain(
                d,
                cfg=cfg,
                tasks=args.tasks,
                k=args.k,
                rsft_epochs=args.rsft_epochs,
                held_out=held_out,
                log=log,
            )
        )
    print(markdown_table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return 0


def _run_chess_variants(cfg: Config, args: argparse.Namespace) -> int:
    """`whale-lab micro calibrate --chess-variants`: the table on stdout, the log on stderr."""
    from whale_lab.micro.calibrate import chess_variants, variants_table

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"chess h0 against its variants on model {cfg.model.path!r}: val {args.tasks} tasks, "
        f"k={args.k}"
    )
    rows, counts = chess_variants(cfg=cfg, tasks=args.tasks, k=args.k, log=log)
    print(variants_table(rows, counts, args.k))
    if args.json_out:
        out = {"k": args.k, "first_move_tasks": counts, "rows": [asdict(r) for r in rows]}
        Path(args.json_out).write_text(json.dumps(out, indent=2) + "\n")
    return 0
