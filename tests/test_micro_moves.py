"""Chess moves as tokens, and the listed-move mass diagnostic the calibration reports."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import chess
import pytest

from whale_lab.micro import pretrain as P

REPO = Path(__file__).resolve().parents[1]


def test_move_shapes_cover_every_legal_move_and_nothing_impossible() -> None:
    from whale_lab.domains.chess_puzzles import load_builtin_puzzles

    shapes = set(P.uci_move_shapes())
    assert len(shapes) == 1968  # 1,456 queen lines + 336 knight jumps + 176 promotions
    assert {"e2e4", "g1f3", "e7e8q", "b2a1n", "e1g1"} <= shapes
    assert not {"a1c4", "e2e2", "e7e8k", "e6e8q"} & shapes
    seen = 0
    for p in load_builtin_puzzles():
        board = chess.Board(p.fen)
        for uci in p.moves:
            for m in board.legal_moves:
                assert m.uci() in shapes
                seen += 1
            board.push_uci(uci)
    assert seen > 1000


def test_move_tokens_make_a_move_one_token() -> None:
    from whale_lab.models import train_byte_bpe_tokenizer

    tok = train_byte_bpe_tokenizer(["<move>e2e4</move> the answer is 42"] * 20, 320)
    P.add_square_tokens(tok)
    assert P.add_move_tokens(tok) == 1968

    def pieces(text: str) -> list[str]:
        return [tok.decode([i]) for i in tok(text, add_special_tokens=False)["input_ids"]]

    assert "e2e4" in pieces("<move>e2e4</move>")
    assert pieces("a7a8n") == ["a7a8n"]  # the longest match wins over square + square + letter
    assert "e3" in pieces("FEN: 8/8/8/8/4P3/8/8/8 b - e3 0 1")  # squares alone stay squares
    assert tok.decode(tok("<move>g1f3</move>", add_special_tokens=False)["input_ids"]) == (
        "<move>g1f3</move>"
    )


def test_pretrain_option_switches_move_tokens() -> None:
    import argparse

    p = argparse.ArgumentParser()
    P.add_arguments(p)
    assert P.config_from_args(p.parse_args([])).move_tokens is False
    assert P.config_from_args(p.parse_args(["--move-tokens"])).move_tokens is True


@pytest.fixture(scope="module")
def chess_setup() -> tuple[object, object, object, list[object]]:
    from whale_lab.config import load_config
    from whale_lab.domains import make_domain
    from whale_lab.models import load_model_and_tokenizer

    cfg = load_config(None)
    cfg = cfg.replace(
        domain=replace(
            cfg.domain, name="chess", harness="", splits=replace(cfg.domain.splits, val=3)
        )
    )
    domain = make_domain(cfg)
    model, tok = load_model_and_tokenizer("micro", dtype="float32")
    return model, tok, domain, domain.tasks("val")


def test_listed_move_mass_matches_a_plain_forward_pass(
    chess_setup: tuple[object, object, object, list[object]],
) -> None:
    import torch

    from whale_lab.micro.move_mass import _runtime, listed_move_mass

    model, tok, domain, tasks = chess_setup
    harness = REPO / "harnesses" / "chess" / "h0.py"
    result = listed_move_mass(model, tok, domain, tasks[:1], harness)
    assert result.tasks == 1
    assert 0.0 < result.solution <= result.listed <= 1.0

    # the same number, one move at a time, token by token, from the harness's own prompt
    task = tasks[0]
    env = domain.make_env(task)  # type: ignore[attr-defined]
    runtime = _runtime(harness)
    ctx = dict(env.context(), turn_count=1, max_turns=runtime.info()["max_turns"])
    history = [{"type": "observation", "observation": env.initial_observation()}]
    messages = runtime.render(dict(task.fields), history, ctx)
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    prefix = tok(text + "<move>", add_special_tokens=False)["input_ids"]  # type: ignore[operator]
    total = 0.0
    for move in env.board.legal_moves:
        ids = list(prefix)
        logp = 0.0
        for t in tok(move.uci(), add_special_tokens=False)["input_ids"]:  # type: ignore[operator]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]  # type: ignore[operator]
            logp += float(torch.log_softmax(logits.float(), -1)[t])
            ids.append(t)
        total += math.exp(logp)
    assert result.listed == pytest.approx(total, rel=1e-3)


def test_listed_move_mass_is_a_mean_over_positions(
    chess_setup: tuple[object, object, object, list[object]],
) -> None:
    from whale_lab.micro.move_mass import listed_move_mass

    model, tok, domain, tasks = chess_setup
    harness = REPO / "harnesses" / "chess" / "calibration_strong.py"
    each = [listed_move_mass(model, tok, domain, [t], harness) for t in tasks]
    both = listed_move_mass(model, tok, domain, tasks, harness)
    assert both.tasks == len(tasks) == 3
    assert both.listed == pytest.approx(sum(e.listed for e in each) / 3, rel=1e-4)
    assert both.legal_moves == pytest.approx(sum(e.legal_moves for e in each) / 3)
    assert "listed-move mass" in both.summary()
